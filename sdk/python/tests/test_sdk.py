"""The Python SDK's pure parts on CPython, against the bindings
componentize-py generates for the provider world (scripts/test-sdks.sh puts
them on the path): `python -m unittest discover sdk/python/tests`."""

import unittest
from dataclasses import dataclass, field
from typing import Optional

from capstan_plugin import (
    ConfigProvider,
    HttpError,
    Request,
    Response,
    api_error,
    camel,
    parse_config,
    split_url,
    to_plugin_error,
    transient,
)
from capstan_plugin.errors import describe
from capstan_plugin.testing import contract_error
from capstan_plugin.http import wire_headers


@dataclass
class Limits:
    cpu: str


@dataclass
class Config:
    endpoint: str
    instance_type: Optional[str] = None
    replicas: int = 1
    tags: dict[str, str] = field(default_factory=dict)
    zones: list[str] = field(default_factory=list)
    limits: Optional[Limits] = None


class ConfigTest(unittest.TestCase):
    def test_fields_are_camel_case_and_defaults_fill_in(self):
        self.assertEqual(camel("instance_type"), "instanceType")
        c = parse_config('{"endpoint":"http://x","instanceType":"small","limits":{"cpu":"1"}}', Config)
        self.assertEqual(c, Config("http://x", "small", 1, {}, [], Limits("1")))

    def test_every_bad_config_names_its_field(self):
        cases = {
            '{"endpoint":1}': "endpoint: expected a string, got a number",
            '{"endpoint":"x","replicas":true}': "replicas: expected an integer, got a boolean",
            '{"endpoint":"x","nope":1}': "nope: unknown field; expected one of endpoint, instanceType, limits, replicas, tags, zones",
            "{}": "endpoint: missing (it is required)",
            '{"endpoint":"x","tags":{"team":2}}': "tags.team: expected a string, got a number",
            '{"endpoint":"x","zones":["a",3]}': "zones[1]: expected a string, got a number",
            '{"endpoint":"x","limits":{}}': "limits.cpu: missing (it is required)",
            "[]": "config: expected an object, got an array",
        }
        for text, message in cases.items():
            self.assertEqual(contract_error(lambda: parse_config(text, Config)), f"InvalidConfig: config is invalid: {message}")
        self.assertIn("is not valid JSON", contract_error(lambda: parse_config("{", Config)))


class HttpTest(unittest.TestCase):
    def test_urls_split_into_wasi_parts(self):
        self.assertEqual(split_url("http://127.0.0.1:8080/v1/i?x=1"), (False, "127.0.0.1:8080", "/v1/i?x=1"))
        self.assertEqual(split_url("https://h"), (True, "h", "/"))
        self.assertEqual(split_url("https://h?q"), (True, "h", "/?q"))
        for bad in ("ftp://h", "http:///x"):
            with self.assertRaises(HttpError):
                split_url(bad)

    def test_every_request_carries_its_exact_length(self):
        r = Request.json("POST", "http://h/v1", {"a": "é"})
        self.assertEqual(r.body, '{"a":"\\u00e9"}'.encode())
        headers = dict(wire_headers(Request("POST", "http://h", [("Content-Length", "999")], r.body)))
        self.assertEqual(headers["content-length"], str(len(r.body)).encode())
        self.assertEqual(dict(wire_headers(Request.delete("http://h/x")))["content-length"], b"0")

    def test_capstan_http_is_used_when_the_world_has_it_and_its_errors_map(self):
        import componentize_py_types
        from capstan_plugin import _bindings, http as sdk_http
        from wit_world.imports import http as host

        sent = []

        class Host:
            Request = host.Request

            def __init__(self, answer):
                self.answer = answer

            def send(self, request):
                sent.append(request)
                if isinstance(self.answer, Exception):
                    raise self.answer
                return self.answer

        self.assertIsNotNone(_bindings.CAPSTAN_HTTP, "0.3.0 worlds import capstan:plugin/http")
        real = _bindings.CAPSTAN_HTTP
        try:
            _bindings.CAPSTAN_HTTP = Host(host.Response(201, [("content-type", "application/json")], b'{"id":"i-1"}'))
            answer = sdk_http.send(
                Request("POST", "http://h:1/v1", [("Content-Length", "999"), ("X-A", "b")], b'{"a":1}')
            )
            self.assertEqual((answer.status, answer.json()), (201, {"id": "i-1"}))
            # The host frames the body itself: no content-length goes in.
            self.assertEqual(sent[0], host.Request("POST", "http://h:1/v1", [("x-a", "b")], b'{"a":1}'))
            for error, kind in [
                (host.Error_Denied(), "denied"),
                (host.Error_InvalidRequest("headers: `host` is set by the host"), "invalid-url"),
                (host.Error_LimitReached(), "transport"),
                (host.Error_Transport("reset"), "transport"),
            ]:
                _bindings.CAPSTAN_HTTP = Host(componentize_py_types.Err(error))
                with self.assertRaises(HttpError) as caught:
                    sdk_http.send(Request.get("http://h:1/x"))
                self.assertEqual(caught.exception.kind, kind, error)
        finally:
            _bindings.CAPSTAN_HTTP = real

    def test_answers_map_to_contract_errors(self):
        def answer(status, body=b'{"code":"Throttling","message":"slow down"}', headers=()):
            return describe(api_error(Response(status, list(headers), body), "creating"))

        self.assertEqual(answer(403), "Unauthorized: creating: HTTP 403 Throttling: slow down")
        self.assertEqual(answer(404), "NotFound: creating: HTTP 404 Throttling: slow down")
        self.assertEqual(answer(422), "InvalidConfig: creating: HTTP 422 Throttling: slow down")
        self.assertEqual(answer(409), "Terminal: creating: HTTP 409 Throttling: slow down")
        self.assertEqual(answer(500, b"<html>oops"), "Transient: creating: HTTP 500 <html>oops")
        throttled = api_error(Response(429, [("Retry-After", "3")], b"{}"), "creating")
        self.assertEqual(throttled.value.value.retry_after_ms, 3000)
        self.assertEqual(api_error(Response(503, [], b""), "x").value.value.retry_after_ms, 5000)
        self.assertTrue(describe(to_plugin_error(HttpError("denied", "no"))).startswith("Unauthorized"))
        self.assertTrue(describe(to_plugin_error(HttpError("invalid-url", "bad"))).startswith("InvalidConfig: endpoint"))
        self.assertEqual(transient("x", 0).value.value.retry_after_ms, 1)


class ProviderTest(unittest.TestCase):
    def test_a_bad_config_is_refused_before_the_plugin_runs(self):
        ran = []

        @dataclass
        class Small:
            size: int

        class P(ConfigProvider):
            Config = Small

            def check(self, config):
                ran.append(config)

        P().validate('{"size": 2}')
        self.assertEqual(ran, [Small(2)])
        self.assertEqual(
            contract_error(lambda: P().validate('{"size": "big"}')),
            "InvalidConfig: provider config is invalid: size: expected an integer, got a string",
        )
        self.assertEqual(len(ran), 1)


if __name__ == "__main__":
    unittest.main()

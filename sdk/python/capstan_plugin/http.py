"""Outbound HTTP from a plugin: through `capstan:plugin/http` (contract
0.3.0, one host call per request) when the plugin is built for a 0.3.0
world, else through `wasi:http/outgoing-handler` (hosts of every version).
The choice is made at build time, by the world the bindings come from.

The host lets a request through only to a destination the manifest declares
and an admin grants, and attaches the credential itself: never put one in a
request. Use `send(Request.json("POST", url, body))`; map failures with
`to_plugin_error` and non-2xx answers with `api_error`.

Requests always carry an exact `content-length` (a body written without
one reaches some servers empty, and a bodiless DELETE would go out chunked).
The wire work (`split_url`, `wire_headers`) is pure and tested on CPython;
`send` is the thin part that needs the sandbox.
"""

import json as _json
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _bindings, errors

#: Largest response body read through wasi:http; more fails the request
#: (through capstan:plugin/http the host's limit, 8 MiB, applies).
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: `blocking-write-and-flush` takes at most this much per call.
WRITE_CHUNK_BYTES = 4096
READ_CHUNK_BYTES = 64 * 1024

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


@dataclass
class Request:
    method: str
    url: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @classmethod
    def get(cls, url: str) -> "Request":
        return cls("GET", url)

    @classmethod
    def delete(cls, url: str) -> "Request":
        return cls("DELETE", url)

    @classmethod
    def json(cls, method: str, url: str, value: Any) -> "Request":
        """A request with a JSON body (compact, keys as given)."""
        body = _json.dumps(value, separators=(",", ":")).encode()
        return cls(method, url, [("content-type", "application/json")], body)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        """The first value of a header, by case-insensitive name."""
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), None)

    def json(self) -> Any:
        return _json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class HttpError(Exception):
    """Why a request got no answer: `kind` is `denied` (the destination is
    not granted), `invalid-url` or `transport`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def split_url(url: str) -> tuple[bool, str, str]:
    """`(https, authority, path_with_query)` of an absolute http(s) URL."""
    for scheme, https in (("https://", True), ("http://", False)):
        if url.startswith(scheme):
            rest = url[len(scheme):]
            break
    else:
        raise HttpError("invalid-url", f"`{url}`: only http:// and https:// URLs are supported")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if not authority:
        raise HttpError("invalid-url", f"`{url}`: no host")
    if not path.startswith("/"):
        path = "/" + path
    return https, authority, path


def wire_headers(request: Request) -> list[tuple[str, bytes]]:
    """Lowercased headers, with an exact `content-length` in place of any given."""
    headers = [
        (k.lower(), v.encode()) for k, v in request.headers if k.lower() != "content-length"
    ]
    headers.append(("content-length", str(len(request.body)).encode()))
    return headers


def to_plugin_error(error: HttpError) -> Exception:
    """A failed request as a contract error: denied -> unauthorized, a bad
    URL -> invalid-config, anything else -> transient."""
    if error.kind == "denied":
        return errors.unauthorized(str(error))
    if error.kind == "invalid-url":
        return errors.invalid_config(f"endpoint: {error}")
    return errors.transient(str(error), 2000)


def api_error(response: Response, doing: str) -> Exception:
    """A non-success answer as a contract error, by status: 401/403
    unauthorized, 404 not-found, 429 transient after `retry-after`, 503
    transient after 5 s, other 5xx after 1 s, 400/422 invalid-config, the
    rest terminal. The message quotes the API's `code: message` if JSON."""
    try:
        body = response.json()
        detail = f"{body.get('code', 'Unknown')}: {body.get('message', '')}"
    except (ValueError, AttributeError):
        detail = response.text()[:200]
    message = f"{doing}: HTTP {response.status} {detail}"
    status = response.status
    if status in (401, 403):
        return errors.unauthorized(message)
    if status == 404:
        return errors.not_found(message)
    if status == 429:
        try:
            seconds = int((response.header("retry-after") or "1").strip())
        except ValueError:
            seconds = 1
        return errors.transient(message, seconds * 1000)
    if status == 503:
        return errors.transient(message, 5000)
    if 500 <= status <= 599:
        return errors.transient(message, 1000)
    if status in (400, 422):
        return errors.invalid_config(message)
    return errors.terminal(message)


def send(request: Request) -> Response:
    """Send `request` through the sandbox and read the whole answer.
    Raises HttpError when there is no answer."""
    if _bindings.CAPSTAN_HTTP is not None:
        return _send_capstan(request)
    return _send_wasi(request)


def _send_capstan(request: Request) -> Response:
    """One host call: `capstan:plugin/http.send`."""
    host = _bindings.CAPSTAN_HTTP
    Err = _bindings.need(_bindings.RESULTS, "componentize_py_types").Err
    method = request.method.upper()
    if method not in METHODS:
        raise HttpError("invalid-url", f"`{request.method}` is not an HTTP method this SDK sends")
    split_url(request.url)
    headers = [(k.lower(), v) for k, v in request.headers if k.lower() != "content-length"]
    try:
        answer = host.send(host.Request(method, request.url, headers, bytes(request.body)))
    except Err as e:
        kind = type(e.value).__name__
        if kind == "Error_Denied":
            raise HttpError("denied", f"{request.url} is not a destination this plugin may reach") from None
        if kind == "Error_InvalidRequest":
            raise HttpError("invalid-url", f"{request.url}: {e.value.value}") from None
        detail = getattr(e.value, "value", None) or kind.removeprefix("Error_")
        raise HttpError("transport", f"{request.method} {request.url}: {detail}") from None
    return Response(answer.status, list(answer.headers), bytes(answer.body))


def _send_wasi(request: Request) -> Response:
    """wasi:http: a request, its body stream, a future and the response's."""
    what = "wasi:http (build a provider or updater for `provider-http-plugin` or `updater-http-plugin`)"
    t = _bindings.need(_bindings.HTTP_TYPES, what)
    outgoing_handler = _bindings.need(_bindings.OUTGOING_HANDLER, what)
    streams = _bindings.need(_bindings.STREAMS, what)
    Err = _bindings.need(_bindings.RESULTS, "componentize_py_types").Err

    method = request.method.upper()
    if method not in METHODS:
        raise HttpError("invalid-url", f"`{request.method}` is not an HTTP method this SDK sends")
    https, authority, path = split_url(request.url)
    try:
        fields = t.Fields.from_list(wire_headers(request))
    except Err as e:
        raise HttpError("transport", f"invalid request header: {e.value}") from None
    out = t.OutgoingRequest(fields)
    out.set_method(getattr(t, "Method_" + method.capitalize())())
    out.set_scheme(t.Scheme_Https() if https else t.Scheme_Http())
    out.set_authority(authority)
    out.set_path_with_query(path)
    body = out.body()

    def failed(code: object) -> HttpError:
        if type(code).__name__ == "ErrorCode_HttpRequestDenied":
            return HttpError("denied", f"{request.url} is not a destination this plugin may reach")
        return HttpError("transport", f"{request.method} {request.url}: {code}")

    try:
        future = outgoing_handler.handle(out, None)
    except Err as e:
        raise failed(e.value) from None
    if request.body:
        with body.write() as stream:
            for at in range(0, len(request.body), WRITE_CHUNK_BYTES):
                try:
                    stream.blocking_write_and_flush(request.body[at : at + WRITE_CHUNK_BYTES])
                except Err as e:
                    # The host may close the stream once it has read
                    # `content-length` bytes: that is delivery, not failure.
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise HttpError("transport", f"writing the request body: {e.value}") from None
    t.OutgoingBody.finish(body, None)

    while True:
        with future.subscribe() as ready:
            ready.block()
        answer = future.get()
        if answer is None:
            continue
        # Optional[Result[Result[IncomingResponse, ErrorCode], None]]: the
        # outer `Err` means the response was already taken.
        if type(answer).__name__ == "Err":
            raise HttpError("transport", "the response was already taken")
        inner = answer.value
        if type(inner).__name__ == "Err":
            raise failed(inner.value)
        response = inner.value
        break
    status = response.status()
    headers = [(k, v.decode("latin-1")) for k, v in response.headers().entries()]
    incoming = response.consume()
    data = bytearray()
    with incoming.stream() as stream:
        while len(data) <= MAX_RESPONSE_BYTES:
            try:
                data += stream.blocking_read(READ_CHUNK_BYTES)
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    break
                raise HttpError("transport", f"reading the response body: {e.value}") from None
    if len(data) > MAX_RESPONSE_BYTES:
        raise HttpError("transport", f"the response body exceeds {MAX_RESPONSE_BYTES} bytes")
    return Response(status, headers, bytes(data))

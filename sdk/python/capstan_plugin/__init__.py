"""The Capstan plugin SDK for Python (componentize-py).

A Python plugin is a WebAssembly component: `componentize-py` builds it from
your module and the bindings of a contract world (`wit/`,
`capstan:plugin@0.3.0`: `provider-http-plugin`, `updater-http-plugin`,
`addon-plugin`), then `capstan plugin annotate` embeds your
`capstan-plugin.json`. This package gives what the Rust SDK gives:

- `errors`: the contract's errors to `raise` (`invalid_config`, `transient`, ...);
- `config`: JSON configuration into your dataclass, errors naming the field;
- `http`: requests through `capstan:plugin/http` (0.3.0 worlds, one host
  call each) or `wasi:http` (0.2.0 worlds, with an exact
  `content-length`), and the usual mapping of HTTP answers to contract
  errors;
- `log`: structured logs into the host's logs;
- `provider.ConfigProvider`: a provider base that parses the configuration
  before your code runs;
- `addon`: the version table, the asked version, and Deployment and
  DaemonSet health for `assess`;
- `updater`: the answers of `update` (`done`, `in_progress`, `failed`).

Nothing here needs the bindings until it is called, so pure logic is
testable on CPython.
"""

from . import addon, errors, log, updater
from .config import ConfigError, camel, check_config, parse_config
from .errors import invalid_config, not_found, terminal, transient, unauthorized
from .http import HttpError, Request, Response, api_error, send, split_url, to_plugin_error
from .provider import ConfigProvider

__all__ = [
    "ConfigError",
    "ConfigProvider",
    "HttpError",
    "Request",
    "Response",
    "addon",
    "api_error",
    "camel",
    "check_config",
    "errors",
    "invalid_config",
    "log",
    "not_found",
    "parse_config",
    "send",
    "split_url",
    "terminal",
    "to_plugin_error",
    "transient",
    "unauthorized",
    "updater",
]

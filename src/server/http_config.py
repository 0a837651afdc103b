"""The [http] config section: the health and metrics endpoint (server.httpd), off by default.

``listen = "127.0.0.1:9100"`` turns it on (also ``--http-listen`` / ``NPLT_HTTP_LISTEN``). A
non-loopback address follows the NPLT port's rule: it is refused unless the endpoint has
authentication (``token_sha256``, or ``[auth] users`` whose tokens are accepted too) or
``insecure = true`` (``--http-insecure`` / ``NPLT_HTTP_INSECURE``) accepts the risk.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from server.config_base import ConfigError, check_keys, get_bool, get_float, get_int, get_str

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_LISTEN_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+)):(?P<port>\d{1,5})$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_listen(value: str) -> tuple[str, int]:
    """ "127.0.0.1:9100" / "[::1]:9100" / "localhost:0" -> (host, port); ConfigError otherwise."""
    m = _LISTEN_RE.match(value.strip())
    if not m or int(m.group("port")) > 65535:
        raise ConfigError("http.listen", f"expected HOST:PORT (e.g. \"127.0.0.1:9100\", \"[::1]:9100\"), got {value!r}")
    return m.group("v6") or m.group("host"), int(m.group("port"))


@dataclass(slots=True)
class HttpConfig:
    """[http]: GET /healthz, /readyz, /metrics (docs/server.md "HTTP health and metrics")."""
    listen: str | None = None              # "HOST:PORT"; None = no HTTP endpoint
    insecure: bool = False                 # allow a non-loopback address without any token
    token_sha256: str | None = None        # /metrics needs "Authorization: Bearer TOKEN" when set
    max_connections: int = 32              # concurrent HTTP connections; more are closed at once
    request_timeout_s: float = 5.0         # a request must arrive and be answered within this
    max_request_bytes: int = 8192          # request line + headers
    readiness_timeout_s: float = 2.0       # /readyz answers 503 when its checks take longer
    loop_lag_interval_s: float = 0.25      # event-loop lag sampling period (while the endpoint runs)

    @property
    def address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen) if self.listen else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HttpConfig:
        s = "http"
        check_keys(s, d, {f.name for f in dataclasses.fields(cls)})
        cfg = cls(
            listen=get_str(s, d, "listen", None) or None,
            insecure=get_bool(s, d, "insecure", False),
            token_sha256=get_str(s, d, "token_sha256", None),
            max_connections=get_int(s, d, "max_connections", 32, 1, 10_000),
            request_timeout_s=get_float(s, d, "request_timeout_s", 5.0, 0.1, 600.0),
            max_request_bytes=get_int(s, d, "max_request_bytes", 8192, 1024, 1 << 20),
            readiness_timeout_s=get_float(s, d, "readiness_timeout_s", 2.0, 0.05, 60.0),
            loop_lag_interval_s=get_float(s, d, "loop_lag_interval_s", 0.25, 0.01, 60.0),
        )
        if cfg.listen is not None:
            parse_listen(cfg.listen)
        if cfg.token_sha256 is not None:
            if not _SHA256_RE.match(cfg.token_sha256.lower()):
                raise ConfigError("http.token_sha256", "expected 64 hex digits (see `nplt-server hash-token TOKEN`)")
            cfg.token_sha256 = cfg.token_sha256.lower()
        return cfg


def check_http_bind(http: HttpConfig, users_configured: bool, is_loopback: Any) -> None:
    """The NPLT port's rule for the HTTP endpoint: no non-loopback address without authentication."""
    address = http.address
    if address is None or is_loopback(address[0]) or http.insecure:
        return
    if http.token_sha256 is None and not users_configured:
        raise ConfigError(
            "http.listen",
            f"refusing to serve HTTP on {address[0]!r}: /metrics would be readable by anyone who can reach it. "
            "Set [http] token_sha256 (or configure [auth] users), listen on 127.0.0.1, or set [http] insecure = "
            "true (--http-insecure) to accept the risk.")


# -- flags and environment (wired by server.cli) ------------------------------------------------

def add_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("http")
    g.add_argument("--http-listen", metavar="HOST:PORT", help="serve /healthz, /readyz, /metrics (default off)")
    g.add_argument("--http-insecure", action=argparse.BooleanOptionalAction, default=None,
                   help="allow a non-loopback HTTP address without a token (default off)")


def env_overrides(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, Any] = {}
    if "NPLT_HTTP_LISTEN" in env:
        out["listen"] = env["NPLT_HTTP_LISTEN"]
    if "NPLT_HTTP_INSECURE" in env:
        raw = env["NPLT_HTTP_INSECURE"].strip().lower()
        if raw not in _TRUE | _FALSE:
            raise ConfigError("NPLT_HTTP_INSECURE", f"expected true or false, got {env['NPLT_HTTP_INSECURE']!r}")
        out["insecure"] = raw in _TRUE
    return {"http": out} if out else {}


def flag_overrides(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, Any] = {}
    if getattr(ns, "http_listen", None) is not None:
        out["listen"] = ns.http_listen
    if getattr(ns, "http_insecure", None) is not None:
        out["insecure"] = ns.http_insecure
    return {"http": out} if out else {}

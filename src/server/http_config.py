"""The [http] config section: the health and metrics endpoint (server.httpd), off by default.

``listen = "127.0.0.1:9100"`` turns it on (also ``--http-listen`` / ``NPLT_HTTP_LISTEN``). A
non-loopback address is refused unless the endpoint has its own token (``token_sha256``) or
``insecure = true`` (``--http-insecure`` / ``NPLT_HTTP_INSECURE``) accepts the risk: ``[auth] users``
are not enough, since their NPLT login tokens are accepted for /metrics from loopback clients only
(over plain HTTP across a network a scraper would send a token that reads that user's history).
"""
from __future__ import annotations

import argparse
import re
from typing import Any, ClassVar, Mapping

from pydantic import Field, field_validator

from protocol.settings import Invalid, parse_env
from server.config_base import ConfigError, Section, TokenDigest

_LISTEN_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+)):(?P<port>\d{1,5})$")


def parse_listen(value: str) -> tuple[str, int]:
    """ "127.0.0.1:9100" / "[::1]:9100" / "localhost:0" -> (host, port); Invalid otherwise."""
    m = _LISTEN_RE.match(value.strip())
    if not m or int(m.group("port")) > 65535:
        raise Invalid(f"expected HOST:PORT (e.g. \"127.0.0.1:9100\", \"[::1]:9100\"), got {value!r}")
    return m.group("v6") or m.group("host"), int(m.group("port"))


class HttpConfig(Section):
    """[http]: GET /healthz, /readyz, /metrics (docs/server.md "HTTP health and metrics")."""
    section: ClassVar[str] = "http"
    listen: str | None = None              # "HOST:PORT"; None (or "") = no HTTP endpoint
    insecure: bool = False                 # allow a non-loopback address without any token
    token_sha256: TokenDigest | None = None   # /metrics needs "Authorization: Bearer TOKEN" when set
    max_connections: int = Field(32, ge=1, le=10_000)   # concurrent HTTP connections (see max_connections_per_ip)
    # concurrent connections from one client address (IPv6: one /64). At either cap a newcomer closes the oldest
    # connection whose request head has not arrived yet; it is refused only when every slot has a complete head.
    max_connections_per_ip: int = Field(8, ge=1, le=10_000)
    header_timeout_s: float = Field(2.0, ge=0.05, le=600.0)   # request line + headers must arrive within this
    request_timeout_s: float = Field(5.0, ge=0.1, le=600.0)   # a request must arrive and be answered within this
    max_request_bytes: int = Field(8192, ge=1024, le=1 << 20)   # request line + headers
    readiness_timeout_s: float = Field(2.0, ge=0.05, le=60.0)   # /readyz answers 503 when its checks take longer
    loop_lag_interval_s: float = Field(0.25, ge=0.01, le=60.0)  # event-loop lag sampling period (while the endpoint runs)

    @property
    def address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen) if self.listen else None

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v:
            parse_listen(v)
        return v or None


def check_http_bind(http: HttpConfig, users_configured: bool, is_loopback: Any) -> None:
    """No non-loopback HTTP address without the endpoint's own token (``token_sha256``) or ``insecure``.

    ``users_configured`` only changes the message: users' login tokens are accepted for /metrics from
    loopback clients only, so they authenticate no remote scraper."""
    address = http.address
    if address is None or is_loopback(address[0]) or http.insecure:
        return
    if http.token_sha256 is None:
        why = ("/metrics would be readable by anyone who can reach it" if not users_configured else
               "[auth] users' login tokens are accepted for /metrics from loopback clients only (a scraper "
               "would send a token that reads that user's history, in clear over plain HTTP)")
        raise ConfigError(
            "http.listen",
            f"refusing to serve HTTP on {address[0]!r}: {why}. Set [http] token_sha256 (a dedicated scraper "
            "token: nplt-server hash-token TOKEN), listen on 127.0.0.1, or set [http] insecure = true "
            "(--http-insecure) to accept the risk.")


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
        try:
            out["insecure"] = parse_env(env["NPLT_HTTP_INSECURE"], bool)
        except Invalid as exc:
            raise ConfigError("NPLT_HTTP_INSECURE", exc.message) from None
    return {"http": out} if out else {}


def flag_overrides(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, Any] = {}
    if getattr(ns, "http_listen", None) is not None:
        out["listen"] = ns.http_listen
    if getattr(ns, "http_insecure", None) is not None:
        out["insecure"] = ns.http_insecure
    return {"http": out} if out else {}

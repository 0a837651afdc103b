"""Client configuration: TOML file, ``NPLT_CLIENT_*`` environment variables and command-line flags.

Precedence: flags > environment > file > defaults. The file is ``--config PATH``, else
``$NPLT_CLIENT_CONFIG``, else ``client.toml`` in the user's config folder (platformdirs:
``$XDG_CONFIG_HOME/nplt/``, by default ``~/.config/nplt/``) when it exists. See docs/client.md.
"""
from __future__ import annotations

import argparse
import os
import ssl
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from client import paths

ENV_PREFIX = "NPLT_CLIENT_"
TOP_KEYS = {"host", "port", "token", "theme", "page_size", "request_timeout_s", "connect_timeout_s",
            "reconnect_initial_s", "reconnect_max_s", "event_queue_size", "sidebar_max_sessions",
            "tls", "keymap"}
TLS_KEYS = {"enabled", "ca_file", "insecure"}


class ClientConfigError(ValueError):
    """A client configuration value is missing, of the wrong type or out of range."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


@dataclass(slots=True)
class TlsConfig:
    enabled: bool = False
    ca_file: str | None = None      # PEM bundle to verify the server with (default: system store)
    insecure: bool = False          # skip certificate and host name verification (testing only)

    def context(self) -> ssl.SSLContext | None:
        """The SSL context to connect with, or None for plain TCP."""
        if not (self.enabled or self.ca_file or self.insecure):
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ClientConfigError("tls.ca_file", f"cannot load {self.ca_file!r}: {exc}") from exc
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


@dataclass(slots=True)
class ClientConfig:
    host: str = "127.0.0.1"
    port: int = 9999
    token: str | None = None
    theme: str = "textual-dark"
    page_size: int = 50                 # messages per history page (server caps at max_page_size)
    request_timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    reconnect_initial_s: float = 0.25
    reconnect_max_s: float = 10.0
    event_queue_size: int = 1000
    sidebar_max_sessions: int = 500     # sessions listed in the sidebar (loaded by pages)
    tls: TlsConfig = field(default_factory=TlsConfig)
    keymap: dict[str, str] = field(default_factory=dict)   # binding id -> keys ("ctrl+n" or "ctrl+n,f2")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config") -> ClientConfig:
        """Build from a (TOML-shaped) mapping; unknown keys and bad types raise ClientConfigError."""
        unknown = sorted(set(d) - TOP_KEYS)
        if unknown:
            raise ClientConfigError(f"{where}.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(TOP_KEYS))})")
        base = cls()
        kw: dict[str, Any] = {}
        for name, kind, lo, hi in (("host", str, None, None), ("token", str, None, None), ("theme", str, None, None),
                                   ("port", int, 0, 65535), ("page_size", int, 1, 1000),
                                   ("event_queue_size", int, 16, 1_000_000), ("sidebar_max_sessions", int, 1, 100_000),
                                   ("request_timeout_s", float, 0.1, 3600), ("connect_timeout_s", float, 0.1, 600),
                                   ("reconnect_initial_s", float, 0.01, 600), ("reconnect_max_s", float, 0.01, 3600)):
            if name in d:
                kw[name] = _typed(f"{where}.{name}", d[name], kind, lo, hi)
        tls = base.tls
        if "tls" in d:
            t = d["tls"]
            if not isinstance(t, Mapping):
                raise ClientConfigError(f"{where}.tls", f"expected a table, got {t!r}")
            bad = sorted(set(t) - TLS_KEYS)
            if bad:
                raise ClientConfigError(f"{where}.tls.{bad[0]}", f"unknown key (allowed: {', '.join(sorted(TLS_KEYS))})")
            tls = TlsConfig(enabled=_typed(f"{where}.tls.enabled", t.get("enabled", False), bool),
                            ca_file=_typed(f"{where}.tls.ca_file", t.get("ca_file"), str),
                            insecure=_typed(f"{where}.tls.insecure", t.get("insecure", False), bool))
        keymap = dict(base.keymap)
        if "keymap" in d:
            km = d["keymap"]
            if not isinstance(km, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                                      for k, v in km.items()):
                raise ClientConfigError(f"{where}.keymap", "expected a table of binding id = \"keys\" strings")
            keymap.update(km)
        return replace(base, **kw, tls=tls, keymap=keymap)

    @classmethod
    def load(cls, args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> ClientConfig:
        """Merge defaults, file, environment and flags (``args`` from ``add_arguments``)."""
        env = os.environ if env is None else env
        path_arg = getattr(args, "config", None) or env.get(ENV_PREFIX + "CONFIG")
        data: dict[str, Any] = {}
        path = Path(path_arg).expanduser() if path_arg else paths.config_file()
        if path_arg or path.exists():
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError as exc:
                raise ClientConfigError(str(path), "config file not found") from exc
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ClientConfigError(str(path), f"cannot read config file: {exc}") from exc
        cfg = cls.from_dict(data, where=str(path))
        return cfg.merge(_from_env(env), "environment").merge(_from_args(args), "flags")

    def merge(self, overrides: dict[str, Any], where: str) -> ClientConfig:
        """Apply flat overrides (``host``, ``port``, ..., ``tls.enabled``, ``tls.ca_file``, ``tls.insecure``)."""
        if not overrides:
            return self
        tls_over = {k[4:]: v for k, v in overrides.items() if k.startswith("tls.")}
        top = {k: v for k, v in overrides.items() if not k.startswith("tls.")}
        merged = ClientConfig.from_dict(top, where=where) if top else ClientConfig()
        kw = {k: getattr(merged, k) for k in top}
        tls = self.tls
        if tls_over:
            t = ClientConfig.from_dict({"tls": {"enabled": tls.enabled, "ca_file": tls.ca_file,
                                                "insecure": tls.insecure, **tls_over}}, where=where).tls
            tls = t
        return replace(self, **kw, tls=tls)


def _typed(path: str, value: Any, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is bool and not isinstance(value, bool) or kind is not bool and (
            isinstance(value, bool) or not isinstance(value, kind)):
        raise ClientConfigError(path, f"expected {kind.__name__}, got {value!r}")
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ClientConfigError(path, f"expected a value in {lo}..{hi}, got {value!r}")
    return value


def _parse_bool(path: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ClientConfigError(path, f"expected true or false, got {text!r}")


def _parse_number(path: str, text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError as exc:
        raise ClientConfigError(path, f"expected {kind.__name__}, got {text!r}") from exc


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("HOST", "TOKEN", "THEME"):
        if ENV_PREFIX + key in env:
            out[key.lower()] = env[ENV_PREFIX + key]
    for key, kind in (("PORT", int), ("PAGE_SIZE", int), ("REQUEST_TIMEOUT_S", float)):
        if ENV_PREFIX + key in env:
            out[key.lower()] = _parse_number(ENV_PREFIX + key, env[ENV_PREFIX + key], kind)
    for key in ("TLS", "TLS_INSECURE"):
        if ENV_PREFIX + key in env:
            out["tls.enabled" if key == "TLS" else "tls.insecure"] = _parse_bool(ENV_PREFIX + key, env[ENV_PREFIX + key])
    if ENV_PREFIX + "TLS_CA_FILE" in env:
        out["tls.ca_file"] = env[ENV_PREFIX + "TLS_CA_FILE"]
    return out


def _from_args(args: argparse.Namespace | None) -> dict[str, Any]:
    if args is None:
        return {}
    out: dict[str, Any] = {}
    for name in ("host", "port", "token", "theme"):
        if getattr(args, name, None) is not None:
            out[name] = getattr(args, name)
    if getattr(args, "tls", False):
        out["tls.enabled"] = True
    if getattr(args, "tls_ca", None):
        out["tls.ca_file"] = args.tls_ca
    if getattr(args, "tls_insecure", False):
        out["tls.insecure"] = True
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection flags shared by the TUI and every subcommand (all default to None: 'not given')."""
    g = parser.add_argument_group("connection")
    g.add_argument("--config", metavar="FILE",
                   help="client config file (default: client.toml in $XDG_CONFIG_HOME/nplt, ~/.config/nplt)")
    g.add_argument("--host", help="server host (default 127.0.0.1)")
    g.add_argument("--port", type=int, help="server port (default 9999)")
    g.add_argument("--token", help="auth token (prefer NPLT_CLIENT_TOKEN: flags show in process lists)")
    g.add_argument("--tls", action="store_true", default=None, help="connect with TLS")
    g.add_argument("--tls-ca", metavar="FILE", help="CA bundle (PEM) to verify the server certificate")
    g.add_argument("--tls-insecure", action="store_true", default=None,
                   help="TLS without certificate verification (testing only)")
    g.add_argument("--theme", help="TUI theme name (default textual-dark)")

"""Client configuration: TOML file, ``NPLT_CLIENT_*`` environment variables and command-line flags.

Precedence: flags > environment > file > defaults. The file is ``--config PATH``, else
``$NPLT_CLIENT_CONFIG``, else ``client.toml`` in the user's config folder (platformdirs:
``$XDG_CONFIG_HOME/nplt/``, by default ``~/.config/nplt/``) when it exists. See docs/client.md.
"""
from __future__ import annotations

import argparse
import difflib
import os
import ssl
import tomllib
from pathlib import Path
from typing import Any, Mapping, get_args

from pydantic import Field, field_validator

from client import paths
from protocol.settings import Invalid, Settings, dotted, parse_env

ENV_PREFIX = "NPLT_CLIENT_"


class ClientConfigError(ValueError):
    """A client configuration value is missing, of the wrong type or out of range."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


class TlsConfig(Settings):
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


class ClientConfig(Settings):
    """The client's settings, each with its default and range (docs/client.md "Configuration")."""
    host: str = "127.0.0.1"
    port: int = Field(9999, ge=1, le=65535)
    token: str | None = Field(None, repr=False)   # a secret: never in a repr
    theme: str = "textual-dark"
    page_size: int = Field(50, ge=1, le=1000)   # messages per history page (server caps at max_page_size)
    request_timeout_s: float = Field(30.0, ge=0.1, le=3600)
    connect_timeout_s: float = Field(10.0, ge=0.1, le=600)
    # seconds without any byte from the server before the client PINGs it; no answer within
    # min(this, 10 s) more and the connection is taken as lost (reconnect; the CLI exits 3).
    # None: twice the server's ping_interval_s from the HELLO limits, at least 5 s, else 120 s
    # (client.link: LIVENESS_DEFAULT_S, LIVENESS_MIN_S, LIVENESS_PONG_S)
    liveness_timeout_s: float | None = Field(None, ge=0.1, le=86_400)
    reconnect_initial_s: float = Field(0.25, ge=0.01, le=600)
    reconnect_max_s: float = Field(10.0, ge=0.01, le=3600)
    event_queue_size: int = Field(1000, ge=16, le=1_000_000)
    sidebar_max_sessions: int = Field(500, ge=1, le=100_000)   # sessions listed in the sidebar (loaded by pages)
    tls: TlsConfig = Field(default_factory=TlsConfig)
    keymap: dict[str, str] = Field(default_factory=dict)   # binding id -> keys ("ctrl+n" or "ctrl+n,f2")

    @field_validator("keymap")
    @classmethod
    def _keys_given(cls, v: dict[str, str]) -> dict[str, str]:
        for binding, keys in v.items():
            if not keys.strip():
                raise Invalid('expected "keys" (e.g. "ctrl+n"), got an empty string', binding)
        return v

    @classmethod
    def from_dict(cls, d: Any, where: str = "config") -> ClientConfig:
        """Build from a (TOML-shaped) mapping; unknown keys and bad values raise ClientConfigError
        naming ``where`` (the file, "environment" or "flags") and the key."""
        try:
            return super().from_dict(d)
        except Invalid as exc:
            raise ClientConfigError(dotted(where, *exc.loc), exc.message) from None

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
        """These settings with ``overrides`` (shaped like the file: ``{"port": 1, "tls": {"enabled": True}}``)."""
        if not overrides:
            return self
        data = self.model_dump()
        data.update({k: v for k, v in overrides.items() if k != "tls"})
        data["tls"].update(overrides.get("tls", {}))
        return ClientConfig.from_dict(data, where=where)


#: settings that have no environment variable (a table: set in the config file)
ENV_EXCLUDED = frozenset({"keymap"})
#: ``[tls] enabled`` is ``NPLT_CLIENT_TLS`` (not ``..._TLS_ENABLED``)
ENV_RENAMED = {("tls", "enabled"): "TLS"}
#: variables of the prefix that name no setting but are read (the config file's path)
ENV_OTHER = frozenset({ENV_PREFIX + "CONFIG"})


def _env_type(annotation: Any) -> type:
    """The scalar type an environment variable's text is parsed as (``float | None``: float)."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if args and isinstance(args[0], type) else annotation


def env_variables() -> dict[str, tuple[tuple[str, ...], type]]:
    """``NPLT_CLIENT_*`` variable -> (the setting's key path, its type), for every setting of
    ``ClientConfig`` and its ``[tls]`` table: the field name in upper case (``[tls]`` ones as
    ``TLS_<NAME>``, ``enabled`` as ``TLS``). ``keymap`` has none (``ENV_EXCLUDED``)."""
    out: dict[str, tuple[tuple[str, ...], type]] = {}
    for name, f in ClientConfig.model_fields.items():
        if name in ENV_EXCLUDED:
            continue
        if name == "tls":
            for sub, g in TlsConfig.model_fields.items():
                key = ENV_RENAMED.get((name, sub), f"TLS_{sub.upper()}")
                out[ENV_PREFIX + key] = ((name, sub), _env_type(g.annotation))
        else:
            out[ENV_PREFIX + name.upper()] = ((name,), _env_type(f.annotation))
    return out


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as ``NPLT_CLIENT_*`` variables (``env_variables``); a variable of the
    prefix that names no setting is a ClientConfigError naming it (a misspelt one would otherwise be
    silently ignored)."""
    known = env_variables()
    out: dict[str, Any] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in ENV_OTHER:
            continue
        if var not in known:
            names = {v.removeprefix(ENV_PREFIX): v for v in [*known, *ENV_OTHER]}
            close = [names[n] for n in difflib.get_close_matches(var.removeprefix(ENV_PREFIX), names, n=1)]
            hint = (": the keymap is set in the config file's [keymap] table" if var == ENV_PREFIX + "KEYMAP"
                    else f": did you mean {close[0]}?" if close else " (docs/client.md, Configuration)")
            raise ClientConfigError(var, f"unknown variable, no client setting has this name{hint}")
        path, typ = known[var]
        try:
            value = parse_env(env[var], typ)
        except Invalid as exc:
            raise ClientConfigError(var, exc.message) from None
        here = out
        for key in path[:-1]:
            here = here.setdefault(key, {})
        here[path[-1]] = value
    return out


def _from_args(args: argparse.Namespace | None) -> dict[str, Any]:
    if args is None:
        return {}
    out: dict[str, Any] = {name: getattr(args, name) for name in ("host", "port", "token", "theme")
                           if getattr(args, name, None) is not None}
    tls = {key: value for key, value in (("enabled", getattr(args, "tls", None) or None),
                                         ("ca_file", getattr(args, "tls_ca", None) or None),
                                         ("insecure", getattr(args, "tls_insecure", None) or None))
           if value is not None}
    return {**out, "tls": tls} if tls else out


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

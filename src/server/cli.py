"""Command line of ``nplt-server``: flags, environment variables, and merging them over the TOML file.

``nplt-server [flags]`` runs the server; ``nplt-server hash-token [TOKEN]`` prints the sha256 to put
in ``[auth] users``. Flags beat ``NPLT_*`` variables, which beat the file, which beats the defaults.
The installed server's default data directory is the user's data directory (platformdirs, XDG on
Linux: ``~/.local/share/nplt-assistant/history``), never the current folder.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping

import platformdirs

from protocol.settings import Invalid, parse_env
from server import http_config
from server.config import (LOG_FORMATS, LOG_LEVELS, MIN_LEGACY_GRACE_MS, LimitsConfig, ServerConfig,
                           ServerSection, load_toml)
from server.config_base import ConfigError

# [server] and [limits] keys settable from the environment / flags (NPLT_<KEY upper>, --<key with dashes>).
SERVER_KEYS = list(ServerSection.model_fields)
LIMIT_KEYS = list(LimitsConfig.model_fields)
_TYPES = {name: f.annotation for name, f in (ServerSection.model_fields | LimitsConfig.model_fields).items()}
APP_NAME = "nplt-assistant"          # the platformdirs application name
LOG_NAME = "nplt-server.log"
LOG_OFF = ("off", "none", "-")       # log_file values that turn the log file off


def default_data_dir() -> str:
    """The installed server's history directory: in the user's data directory, whatever the cwd."""
    return str(platformdirs.user_data_path(APP_NAME) / "history")


def default_log_file(cfg: ServerConfig) -> str | None:
    """Where the server log goes: ``[server] log_file`` ("off": nowhere), else ``logs/nplt-server.log``
    in the data directory, with PostgreSQL too (a node keeps its uploads and knowledge cache there,
    so nodes given their own ``--data-dir`` never share one log file)."""
    chosen = cfg.server.log_file
    if chosen is not None:
        return None if chosen.strip().lower() in LOG_OFF or not chosen.strip() else chosen
    return str(Path(cfg.storage.root) / "logs" / LOG_NAME)


# keys of a TOML file that name files or folders: a relative one is taken from the file's own folder
FILE_PATH_KEYS = (("server", "tls_cert"), ("server", "tls_key"), ("server", "log_file"), ("storage", "root"),
                  ("summarization", "summary_prompt_file"), ("user_memory", "root"))


def anchor_paths(data: dict, base: Path) -> dict:
    """``data`` (a TOML file's tables) with its relative file paths made absolute against ``base``,
    the file's folder: a config in /etc/nplt run by systemd from / finds its cert.pem in /etc/nplt,
    not in /. Flags and environment variables stay relative to the current folder."""
    out = dict(data)
    for section, key in FILE_PATH_KEYS:
        table = out.get(section)
        value = table.get(key) if isinstance(table, dict) else None
        if not isinstance(value, str) or not value.strip() or value.strip().lower() in LOG_OFF:
            continue
        path = Path(value).expanduser()
        if not path.is_absolute():
            out[section] = {**table, key: str(base / path)}
    return out


def build_parser(version: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nplt-server",
        description="NPLT Assistant server. Other commands: `nplt-server hash-token [TOKEN]` prints a "
                    "token's sha256 for [auth]; `nplt-server migrate-json-to-pg` copies JSON history "
                    "and user memory into PostgreSQL (each has --help).",
    )
    if version:
        p.add_argument("--version", action="version", version=f"nplt-server {version}")
    p.add_argument("--config", metavar="PATH", help="TOML config file (env NPLT_CONFIG)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port, 0 = any free port (default 9999)")
    p.add_argument("--data-dir", metavar="DIR",
                   help=f"history directory (storage.root, default {default_data_dir()})")
    p.add_argument("--log-file", metavar="PATH",
                   help="rotating log file (server.log_file; default DATA_DIR/logs/nplt-server.log; 'off': none)")
    p.add_argument("--storage-url", metavar="URL", help="postgresql://... stores history in PostgreSQL (storage.url)")
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, help="any case (default info)")
    p.add_argument("--log-format", type=str.lower, choices=LOG_FORMATS, help="any case (default text)")
    # --no-insecure turns off an insecure = true coming from NPLT_INSECURE or the file.
    p.add_argument("--insecure", action=argparse.BooleanOptionalAction, default=None,
                   help="allow a non-loopback address without any configured user (default off)")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate chain (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key")
    p.add_argument("--legacy-grace-ms", type=int,
                   help=f"how long to wait for HELLO before assuming v2 (300, at least {MIN_LEGACY_GRACE_MS})")
    p.add_argument("--port-file", metavar="PATH", help="write the bound port to PATH once listening")
    lim = p.add_argument_group("limits")
    for name, f in LimitsConfig.model_fields.items():
        lim.add_argument("--" + name.replace("_", "-"), type=f.annotation, metavar="N", help=f"default {f.default}")
    http_config.add_flags(p)
    return p


def _env_value(var: str, raw: str, typ: type) -> Any:
    """Convert an environment string to the key's type, with an error naming the variable."""
    try:
        return parse_env(raw, typ)
    except Invalid as exc:
        raise ConfigError(var, exc.message) from None


def env_overrides(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The ``NPLT_*`` variables this module owns, as a partial config dict."""
    out: dict[str, dict[str, Any]] = {}
    for section, keys in (("server", SERVER_KEYS), ("limits", LIMIT_KEYS)):
        for key in keys:
            var = "NPLT_" + key.upper()
            if var in env:
                out.setdefault(section, {})[key] = _env_value(var, env[var], _TYPES[key])
    if "NPLT_DATA_DIR" in env:
        out.setdefault("storage", {})["root"] = env["NPLT_DATA_DIR"]
    if "NPLT_STORAGE_URL" in env:
        out.setdefault("storage", {})["url"] = env["NPLT_STORAGE_URL"]
    out.update(http_config.env_overrides(env))
    return out


def flag_overrides(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The flags given on the command line, as a partial config dict."""
    out: dict[str, dict[str, Any]] = {}
    for key in SERVER_KEYS:
        v = getattr(ns, key, None)
        if v is not None:
            out.setdefault("server", {})[key] = v
    for key in LIMIT_KEYS:
        v = getattr(ns, key, None)
        if v is not None:
            out.setdefault("limits", {})[key] = v
    if ns.data_dir is not None:
        out.setdefault("storage", {})["root"] = ns.data_dir
    if ns.storage_url is not None:
        out.setdefault("storage", {})["url"] = ns.storage_url
    out.update(http_config.flag_overrides(ns))
    return out


def merge(base: dict, over: dict) -> dict:
    """Section-wise overlay: keys of ``over`` replace those of ``base``."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for section, values in over.items():
        target = out.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(section, f"expected a table, got {type(target).__name__}")
        target.update(values)
    return out


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> ServerConfig:
    """flags > env > file > defaults, then full validation. Without a history directory from any
    of them, the user's data directory (``default_data_dir``)."""
    path = ns.config or env.get("NPLT_CONFIG")
    data = anchor_paths(load_toml(path), Path(os.path.abspath(os.path.expanduser(path))).parent) if path else {}
    data = merge(merge(data, env_overrides(env)), flag_overrides(ns))
    storage = data.get("storage")
    if storage is None or isinstance(storage, dict) and "root" not in storage:
        data = merge(data, {"storage": {"root": default_data_dir()}})
    cfg = ServerConfig.from_dict(data, env=env)
    cfg.config_file = os.path.abspath(path) if path else None
    return cfg


def load_config(argv: list[str] | None = None, env: Mapping[str, str] | None = None,
                path: str | Path | None = None) -> ServerConfig:
    """Parse flags (``argv``), the environment and the TOML file into a validated config."""
    ns = build_parser().parse_args(list(argv or []))
    if path is not None:
        ns.config = str(path)
    return config_from_args(ns, os.environ if env is None else env)

"""Server configuration: the [server], [limits] and [auth] sections plus the sections owned by other packages.

Precedence, highest first: command-line flags > environment ``NPLT_*`` > TOML file (``--config``) > defaults
(flags and environment are read by ``server.cli``: ``load_config``).
The sections of storage, agent, tools and memory are delegated to their owners' ``from_dict``. Every bad value raises :class:`server.config_base.ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from server.agent.config import AgentConfig, LLMConfig
from server.config_base import ConfigError, check_keys, get_bool, get_float, get_int, get_str, get_str_list
from server.http_config import HttpConfig
from server.knowledge.config import KnowledgeConfig
from server.memory.config import MemoryConfig
from server.tools.config import ToolsConfig
from server.transfer_config import TransferConfig
from storage import StorageConfig

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
# A v2 client waits silently for the greeting, so the server decides "v2" after this much silence. A v3
# client sends HELLO right after connecting; a grace period shorter than that HELLO's trip would greet
# every v3 client as v2 (0 ms always does), hence the floor.
MIN_LEGACY_GRACE_MS = 50


def _choice(section: str, d: dict, key: str, default: str, choices: tuple[str, ...]) -> str:
    """A case-insensitive choice (``DEBUG`` = ``debug``), returned in lower case."""
    v = get_str(section, d, key, default)
    if v.lower() not in choices:
        raise ConfigError(f"{section}.{key}", f"expected one of {', '.join(choices)} (any case), got {v!r}")
    return v.lower()


@dataclass(slots=True)
class ServerSection:
    """[server]: where and how to listen."""
    host: str = "127.0.0.1"
    port: int = 9999
    log_level: str = "info"
    log_format: str = "text"
    insecure: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    legacy_grace_ms: int = 300
    log_file: str | None = None       # None: <storage root>/logs/nplt-server.log (docs/server.md); "off": none
    log_max_bytes: int = 5 << 20      # the log file is rotated at this size ...
    log_backups: int = 3              # ... keeping this many old files

    @classmethod
    def from_dict(cls, d: dict) -> ServerSection:
        s, df = "server", cls()   # df: the defaults, written once (the field defaults above)
        check_keys(s, d, {f.name for f in dataclasses.fields(cls)})
        sec = cls(
            host=get_str(s, d, "host", df.host),
            port=get_int(s, d, "port", df.port, 0, 65535),
            log_level=_choice(s, d, "log_level", df.log_level, LOG_LEVELS),
            log_format=_choice(s, d, "log_format", df.log_format, LOG_FORMATS),
            insecure=get_bool(s, d, "insecure", df.insecure),
            tls_cert=get_str(s, d, "tls_cert", df.tls_cert),
            tls_key=get_str(s, d, "tls_key", df.tls_key),
            legacy_grace_ms=get_int(s, d, "legacy_grace_ms", df.legacy_grace_ms, MIN_LEGACY_GRACE_MS, 60_000),
            log_file=get_str(s, d, "log_file", df.log_file),
            log_max_bytes=get_int(s, d, "log_max_bytes", df.log_max_bytes, 4096, 1 << 40),
            log_backups=get_int(s, d, "log_backups", df.log_backups, 0, 1000),
        )
        if not sec.host:
            raise ConfigError("server.host", "must not be empty")
        if (sec.tls_cert is None) != (sec.tls_key is None):
            raise ConfigError("server.tls_cert", "tls_cert and tls_key must be given together")
        return sec


@dataclass(slots=True)
class LimitsConfig:
    """[limits]: every resource bound of the server (docs/server.md)."""
    max_clients: int = 256
    max_message_size: int = 8 << 20
    max_pending_requests: int = 32
    max_page_size: int = 200
    max_queued_turns: int = 8
    max_active_turns_per_user: int = 16
    idle_timeout_s: float = 300.0
    ping_interval_s: float = 60.0
    handshake_timeout_s: float = 10.0
    max_output_buffer: int = 4 << 20
    max_text_chars: int = 32000
    shutdown_grace_s: float = 5.0

    @classmethod
    def from_dict(cls, d: dict) -> LimitsConfig:
        s, df = "limits", cls()   # df: the defaults, written once (the field defaults above)
        check_keys(s, d, {f.name for f in dataclasses.fields(cls)})
        lim = cls(
            max_clients=get_int(s, d, "max_clients", df.max_clients, 1, 1_000_000),
            max_message_size=get_int(s, d, "max_message_size", df.max_message_size, 65535, 1 << 30),
            max_pending_requests=get_int(s, d, "max_pending_requests", df.max_pending_requests, 1, 10_000),
            max_page_size=get_int(s, d, "max_page_size", df.max_page_size, 1, 10_000),
            max_queued_turns=get_int(s, d, "max_queued_turns", df.max_queued_turns, 0, 10_000),
            max_active_turns_per_user=get_int(s, d, "max_active_turns_per_user", df.max_active_turns_per_user, 1, 100_000),
            idle_timeout_s=get_float(s, d, "idle_timeout_s", df.idle_timeout_s, 0.05, 86_400.0),
            ping_interval_s=get_float(s, d, "ping_interval_s", df.ping_interval_s, 0.05, 86_400.0),
            handshake_timeout_s=get_float(s, d, "handshake_timeout_s", df.handshake_timeout_s, 0.05, 3_600.0),
            max_output_buffer=get_int(s, d, "max_output_buffer", df.max_output_buffer, 65536, 1 << 31),
            max_text_chars=get_int(s, d, "max_text_chars", df.max_text_chars, 1, 10_000_000),
            shutdown_grace_s=get_float(s, d, "shutdown_grace_s", df.shutdown_grace_s, 0.1, 600.0),
        )
        if lim.ping_interval_s >= lim.idle_timeout_s:
            raise ConfigError(
                "limits.ping_interval_s",
                f"must be less than limits.idle_timeout_s (got ping_interval_s = {lim.ping_interval_s:g}, "
                f"idle_timeout_s = {lim.idle_timeout_s:g}): a silent connection is pinged after "
                "ping_interval_s and closed after idle_timeout_s, so it would be closed before any PING "
                "(the heartbeat would be off)")
        return lim

    def public(self) -> dict[str, Any]:
        """The limits a client may know (sent in the HELLO reply)."""
        return dataclasses.asdict(self)


@dataclass(slots=True)
class UserEntry:
    user_id: str
    token_sha256: str
    groups: tuple[str, ...] = ()     # knowledge-base groups: members read and upload to group:<name>
    admin: bool = False              # may delete any document it can see (and admin-only requests)


@dataclass(slots=True)
class AuthConfig:
    """[auth]: users and the sha256 of their tokens. No users = single-user mode (user "local")."""
    users: list[UserEntry] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> AuthConfig:
        check_keys("auth", d, {"users"})
        raw = d.get("users", [])
        if not isinstance(raw, list):
            raise ConfigError("auth.users", f"expected a list of tables, got {raw!r}")
        users: list[UserEntry] = []
        seen: set[str] = set()
        owners: dict[str, str] = {}  # token_sha256 -> the user it belongs to
        for i, u in enumerate(raw):
            path = f"auth.users[{i}]"
            check_keys(path, u, {"user_id", "token_sha256", "groups", "admin"})
            uid = get_str(path, u, "user_id", None)
            digest = get_str(path, u, "token_sha256", None)
            if uid is None or not _USER_RE.match(uid):
                raise ConfigError(f"{path}.user_id", f"expected 1..64 characters of [A-Za-z0-9_.@-], got {uid!r}")
            if digest is None or not _SHA256_RE.match(digest.lower()):
                raise ConfigError(f"{path}.token_sha256",
                                  "expected 64 hex digits (see `nplt-server hash-token TOKEN`)")
            digest = digest.lower()
            if uid in seen:
                raise ConfigError(f"{path}.user_id", f"duplicate user {uid!r}")
            if digest in owners:
                raise ConfigError(f"{path}.token_sha256",
                                  f"users {owners[digest]!r} and {uid!r} have the same token: a token must "
                                  "identify one user (give each user its own token)")
            groups = get_str_list(path, u, "groups", [])
            for g in groups:
                if not _USER_RE.match(g):
                    raise ConfigError(f"{path}.groups", f"expected names of 1..64 characters of [A-Za-z0-9_.@-], got {g!r}")
            seen.add(uid)
            owners[digest] = uid
            users.append(UserEntry(uid, digest, tuple(dict.fromkeys(groups)), get_bool(path, u, "admin", False)))
        return cls(users)


MEMORY_SECTIONS = ("summarization", "recall", "context")


@dataclass
class ServerConfig:
    """The whole configuration: the server's own sections plus those owned by storage, agent, tools, memory."""
    server: ServerSection = field(default_factory=ServerSection)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    llm: LLMConfig = field(default_factory=lambda: LLMConfig.from_dict({}, env={}))
    agent: AgentConfig = field(default_factory=AgentConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    memory: MemoryConfig = field(default_factory=lambda: MemoryConfig.from_dict({}))
    http: HttpConfig = field(default_factory=HttpConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)

    @classmethod
    def from_dict(cls, d: dict, env: Mapping[str, str] | None = None) -> ServerConfig:
        """Build every section from one merged dict (TOML layout); unknown sections are errors."""
        if not isinstance(d, dict):
            raise ConfigError("config", "expected a table")
        known = {"server", "limits", "auth", "storage", "llm", "agent", "tools", "http", "knowledge", "transfer",
                 *MEMORY_SECTIONS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(unknown[0], f"unknown section (allowed: {', '.join(sorted(known))})")
        return cls(
            server=ServerSection.from_dict(d.get("server", {})),
            limits=LimitsConfig.from_dict(d.get("limits", {})),
            auth=AuthConfig.from_dict(d.get("auth", {})),
            storage=_section(StorageConfig.from_dict, d.get("storage", {})),
            llm=_section(lambda sec: LLMConfig.from_dict(sec, env=env), d.get("llm", {})),
            agent=_section(AgentConfig.from_dict, d.get("agent", {})),
            tools=_section(ToolsConfig.from_dict, d.get("tools", {})),
            memory=_section(MemoryConfig.from_dict, {k: d[k] for k in MEMORY_SECTIONS if k in d}),
            http=HttpConfig.from_dict(d.get("http", {})),
            knowledge=_section(KnowledgeConfig.from_dict, d.get("knowledge", {})),
            transfer=TransferConfig.from_dict(d.get("transfer", {})),
        )

    @property
    def single_user(self) -> bool:
        return not self.auth.users


def _section(from_dict: Any, section: dict) -> Any:
    """Run a section's from_dict, turning its own ValueError subclasses into ConfigError (keeping the path)."""
    try:
        return from_dict(section)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # e.g. StorageConfigError
        raise ConfigError(getattr(exc, "path", "config"), getattr(exc, "message", str(exc))) from None


def load_toml(path: str | Path) -> dict:
    """Read a TOML file, turning every failure into a ConfigError naming the file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(p), "config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), f"invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read: {exc.strerror}") from None


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP literals; any other name counts as non-loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_policy(cfg: ServerConfig) -> None:
    """Single-user mode has no authentication: refuse non-loopback addresses unless insecure is set."""
    if cfg.single_user and not cfg.server.insecure and not is_loopback(cfg.server.host):
        raise ConfigError(
            "server.host",
            f"refusing to listen on {cfg.server.host!r}: no users are configured ([auth] users), so anyone who "
            "can reach this address could use the assistant without a token. Configure users with tokens, "
            "bind 127.0.0.1, or pass --insecure to accept the risk.",
        )
    udp = cfg.transfer.udp_host
    if udp and cfg.single_user and not cfg.server.insecure and not is_loopback(udp):
        raise ConfigError(
            "transfer.udp_host",
            f"refusing to send downloads from {udp!r}: no users are configured ([auth] users); bind a loopback "
            "address, configure users, or pass --insecure to accept the risk.")

"""Server configuration: the [server], [limits] and [auth] sections plus the sections owned by other packages.

Precedence, highest first: command-line flags > environment ``NPLT_*`` > TOML file (``--config``) > defaults
(flags and environment are read by ``server.cli``: ``load_config``).
Every section is a pydantic model (``server.config_base.Section``) declaring each setting once, with its
default and range; the sections of storage, agent, tools and memory belong to their packages. Every bad
value raises :class:`server.config_base.ConfigError` naming the key.
"""
from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from pydantic import Field, field_validator, model_validator

from protocol.settings import Invalid
from server.agent.config import AgentConfig, LLMConfig
from server.config_base import ConfigError, Section, TokenDigest
from server.http_config import HttpConfig
from server.knowledge.access import RESERVED_NAMES
from server.knowledge.config import KnowledgeConfig
from server.memory.config import MemoryConfig
from server.tools.config import ToolsConfig
from server.cluster_config import ClusterConfig
from server.transfer_config import TransferConfig
from storage import StorageConfig, StorageConfigError

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_USER_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")   # the whole name (fullmatch: "$" would let "alice\n" in)
# A v2 client waits silently for the greeting, so the server decides "v2" after this much silence. A v3
# client sends HELLO right after connecting; a grace period shorter than that HELLO's trip would greet
# every v3 client as v2 (0 ms always does), hence the floor.
MIN_LEGACY_GRACE_MS = 50


class ServerSection(Section):
    """[server]: where and how to listen."""
    section: ClassVar[str] = "server"
    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(9999, ge=0, le=65535)
    log_level: str = "info"           # one of LOG_LEVELS, any case
    log_format: str = "text"          # one of LOG_FORMATS, any case
    insecure: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    legacy_grace_ms: int = Field(300, ge=MIN_LEGACY_GRACE_MS, le=60_000)
    log_file: str | None = None       # None: <storage root>/logs/nplt-server.log (docs/server.md); "off": none
    log_max_bytes: int = Field(5 << 20, ge=4096, le=1 << 40)   # the log file is rotated at this size ...
    log_backups: int = Field(3, ge=0, le=1000)                 # ... keeping this many old files (0: cut in place)
    log_startup_records: int = Field(10_000, ge=0, le=1_000_000)   # records logged before the data directory
    #                                   is locked, kept to be written to the log file once it is (server.main)
    gc_gen0_threshold: int = Field(20_000, ge=100, le=10_000_000)  # allocations between young-generation
    #                                   collections of nplt-server (Python's default: 700; server.main.tune_gc)

    @field_validator("log_level", "log_format")
    @classmethod
    def _any_case(cls, v: str, info: Any) -> str:
        """A case-insensitive choice (``DEBUG`` = ``debug``), kept in lower case."""
        choices = LOG_LEVELS if info.field_name == "log_level" else LOG_FORMATS
        if v.lower() not in choices:
            raise Invalid(f"expected one of {', '.join(choices)} (any case), got {v!r}")
        return v.lower()

    @field_validator("tls_cert", "tls_key")
    @classmethod
    def _pem_path(cls, v: str | None) -> str | None:
        """An empty path is an error, never "no TLS": ``--tls-cert "$CERT"`` or ``NPLT_TLS_CERT=$CERT``
        with CERT unset must not start a plain-TCP server (TLS is off only when both are left out)."""
        if v is not None and not v.strip():
            raise Invalid(f"expected the path of a PEM file, got {v!r} (leave tls_cert and tls_key both out "
                          "for plain TCP)")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerSection:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise Invalid("tls_cert and tls_key must be given together", "tls_cert")
        return self


class LimitsConfig(Section):
    """[limits]: every resource bound of the server (docs/server.md)."""
    section: ClassVar[str] = "limits"
    max_clients: int = Field(256, ge=1, le=1_000_000)
    max_message_size: int = Field(8 << 20, ge=65535, le=1 << 30)
    max_pending_requests: int = Field(32, ge=1, le=10_000)
    max_page_size: int = Field(200, ge=1, le=10_000)
    max_queued_turns: int = Field(8, ge=0, le=10_000)
    max_active_turns_per_user: int = Field(16, ge=1, le=100_000)
    idle_timeout_s: float = Field(300.0, ge=0.05, le=86_400.0)
    ping_interval_s: float = Field(60.0, ge=0.05, le=86_400.0)
    handshake_timeout_s: float = Field(10.0, ge=0.05, le=3_600.0)
    max_output_buffer: int = Field(4 << 20, ge=65536, le=1 << 31)
    max_text_chars: int = Field(32000, ge=1, le=10_000_000)
    shutdown_grace_s: float = Field(5.0, ge=0.1, le=600.0)
    max_total_input_buffer: int = Field(256 << 20, ge=1 << 20, le=1 << 40)
    message_timeout_s: float = Field(60.0, ge=0.05, le=86_400.0)
    max_clients_per_ip: int = Field(64, ge=0, le=1_000_000)
    # HISTORY_EXPORTs built at once, server-wide (each may hold up to max_message_size while it is
    # built); more wait their turn (server.handlers.history.ExportSlots)
    max_concurrent_exports: int = Field(2, ge=1, le=64)
    # with an admin user: a connection arriving when every slot, the admin's included, is taken is kept
    # on standby (counted against max_clients_per_ip only) this long to show an admin's HELLO, which then
    # takes the place of the oldest connection still in its handshake (server.app.Server.make_room);
    # anything else is refused (SERVER_FULL)
    standby_timeout_s: float = Field(1.0, ge=0.05, le=60.0)
    # output not yet taken by the clients (queued, or in the transports' buffers), all connections
    # together: past it a HISTORY_EXPORT is refused SERVER_BUSY (server.handlers.history)
    max_total_output_buffer: int = Field(256 << 20, ge=1 << 20, le=1 << 40)
    # sessions one user may have, those in the trash included (until purged): SESSION_NEW and a
    # CHAT_TEXT that would create one beyond it are refused QUOTA_EXCEEDED (server.sessions)
    max_sessions_per_user: int = Field(10_000, ge=1, le=10_000_000)

    @model_validator(mode="after")
    def _ping_before_idle(self) -> LimitsConfig:
        if self.ping_interval_s >= self.idle_timeout_s:
            raise Invalid(
                f"must be less than limits.idle_timeout_s (got ping_interval_s = {self.ping_interval_s:g}, "
                f"idle_timeout_s = {self.idle_timeout_s:g}): a silent connection is pinged after "
                "ping_interval_s and closed after idle_timeout_s, so it would be closed before any PING "
                "(the heartbeat would be off)", "ping_interval_s")
        return self

    @property
    def standby_s(self) -> float:
        """How long a connection stays on standby: ``standby_timeout_s``, capped by the HELLO deadline
        (an admin's HELLO on standby must still come within ``handshake_timeout_s``)."""
        return min(self.standby_timeout_s, self.handshake_timeout_s)

    def public(self) -> dict[str, Any]:
        """The limits a client may know (sent in the HELLO reply)."""
        return self.model_dump()


class UserEntry(Section):
    """One ``[auth] users`` entry."""
    user_id: str
    token_sha256: TokenDigest
    groups: tuple[str, ...] = Field((), strict=False)   # knowledge-base groups: members read and upload to group:<name>
    admin: bool = False     # may delete any document it can see, use CLIENT_LIST / CLIENT_KILL and the reserved slot

    @field_validator("user_id")
    @classmethod
    def _user_name(cls, v: str) -> str:
        if not _USER_RE.fullmatch(v):
            raise Invalid(f"expected 1..64 characters of [A-Za-z0-9_.@-], got {v!r}")
        return v

    @field_validator("groups")
    @classmethod
    def _group_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for g in v:
            if not _USER_RE.fullmatch(g):
                raise Invalid(f"expected names of 1..64 characters of [A-Za-z0-9_.@-], got {g!r}")
            if g.lower() in RESERVED_NAMES:       # (server.knowledge.access: "personal" is the user's own)
                raise Invalid(f"{g!r} cannot name a group: {g.lower()!r} is reserved (in any case), since a "
                              f"knowledge-base request naming the collection {g.lower()!r} means the user's own "
                              "documents; rename the group")
        return tuple(dict.fromkeys(v))


class AuthConfig(Section):
    """[auth]: users and the sha256 of their tokens. No users = single-user mode (user "local")."""
    section: ClassVar[str] = "auth"
    users: list[UserEntry] = Field(default_factory=list)
    # failed logins (AUTH_FAILED) per remote address (IPv6: per /64), server.auth.LoginGuard: after
    # max_failed_logins within failed_login_window_s, the address's HELLOs are answered only after
    # failed_login_delay_s for login_backoff_s (a right token still logs in); at most
    # max_login_addresses addresses are remembered
    max_failed_logins: int = Field(10, ge=0, le=1_000_000)        # 0: no limit
    failed_login_window_s: float = Field(60.0, ge=1.0, le=86_400.0)
    login_backoff_s: float = Field(60.0, ge=1.0, le=86_400.0)
    max_login_addresses: int = Field(10_000, ge=1, le=10_000_000)
    failed_login_delay_s: float = Field(2.0, ge=0.0, le=5.0)   # (below a client's 10 s HELLO timeout)
    # groups of one user (``users`` entries' ``groups``): each request of the user's costs a little per
    # group (the collections it may read), so a configuration generated with a mistake is refused at
    # start-up rather than slowing every knowledge request of that user
    max_groups_per_user: int = Field(1_000, ge=1, le=1_000_000)

    @property
    def reserved_slots(self) -> int:
        """Connections accepted beyond max_clients for an admin: 1 when a user is marked admin."""
        return 1 if any(u.admin for u in self.users) else 0

    @model_validator(mode="after")
    def _one_user_per_token(self) -> AuthConfig:
        owners: dict[str, str] = {}    # token_sha256 -> the user it belongs to
        seen: set[str] = set()
        for i, u in enumerate(self.users):
            if u.user_id in seen:
                raise Invalid(f"duplicate user {u.user_id!r}", "users", i, "user_id")
            if u.token_sha256 in owners:
                raise Invalid(f"users {owners[u.token_sha256]!r} and {u.user_id!r} have the same token: a token "
                              "must identify one user (give each user its own token)", "users", i, "token_sha256")
            if len(u.groups) > self.max_groups_per_user:
                raise Invalid(f"user {u.user_id!r} is in {len(u.groups)} groups, over max_groups_per_user = "
                              f"{self.max_groups_per_user} (raise it in [auth] if that many are meant)",
                              "users", i, "groups")
            seen.add(u.user_id)
            owners[u.token_sha256] = u.user_id
        return self


MEMORY_SECTIONS = ("summarization", "recall", "context", "user_memory")


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
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # the TOML file it was read from (set by server.cli), which the tools never read (server.wiring)
    config_file: str | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, d: dict, env: Mapping[str, str] | None = None) -> ServerConfig:
        """Build every section from one merged dict (TOML layout); unknown sections are errors."""
        if not isinstance(d, dict):
            raise ConfigError("config", "expected a table")
        known = {"server", "limits", "auth", "storage", "llm", "agent", "tools", "http", "knowledge", "transfer",
                 "cluster", *MEMORY_SECTIONS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(unknown[0], f"unknown section (allowed: {', '.join(sorted(known))})")
        try:
            storage = StorageConfig.from_dict(d.get("storage", {}))
        except StorageConfigError as exc:
            raise ConfigError(exc.path, exc.message) from None
        return cls(
            server=ServerSection.from_dict(d.get("server", {})),
            limits=LimitsConfig.from_dict(d.get("limits", {})),
            auth=AuthConfig.from_dict(d.get("auth", {})),
            storage=storage,
            llm=LLMConfig.from_dict(d.get("llm", {}), env=env),
            agent=AgentConfig.from_dict(d.get("agent", {})),
            tools=ToolsConfig.from_dict(d.get("tools", {})),
            memory=MemoryConfig.from_dict({k: d[k] for k in MEMORY_SECTIONS if k in d}),
            http=HttpConfig.from_dict(d.get("http", {})),
            knowledge=KnowledgeConfig.from_dict(d.get("knowledge", {})),
            transfer=TransferConfig.from_dict(d.get("transfer", {})),
            cluster=ClusterConfig.from_dict(d.get("cluster", {})),
        )

    @property
    def single_user(self) -> bool:
        return not self.auth.users


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

"""Memory configuration: the ``[summarization]``, ``[recall]`` and ``[context]`` sections.

Each section has ``from_dict`` raising ``server.config_base.ConfigError`` with the offending key;
``MemoryConfig.from_dict({"summarization": {...}, "recall": {...}, "context": {...}})`` also checks
the rules that span sections (a ``fraction`` trigger or keep needs ``context.max_input_tokens``).
Defaults and meanings are listed in docs/memory.md.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.config_base import ConfigError, check_keys, get_bool, get_int, get_str

DEFAULT_SUMMARY_PROMPT = (
    "You maintain the running summary of a conversation between a user and an operations assistant. "
    "Merge the previous summary (if any) with the new messages into one concise summary. Keep: key "
    "facts (names, hosts, paths, numbers, dates), the user's intent and stated preferences, decisions "
    "taken and results obtained (including tool results that matter), and open tasks or questions. "
    "Drop small talk and repetition. Never invent anything that is not in the text. Write plain "
    "sentences or short bullet points, in the language the user writes in."
)
DEFAULT_WINDOW_TOKENS = 16000     # used when context.max_input_tokens is not set
MIN_PROMPT_BUDGET = 256           # max_input_tokens - reserve_output_tokens must leave at least this

MAX_PROMPT_FILE_BYTES = 64 * 1024  # a summary_prompt_file larger than this is refused
TOKEN_COUNTERS = ("auto", "estimate", "tiktoken")

TRIGGER_TYPES = ("tokens", "messages", "fraction")
KEEP_TYPES = ("messages", "tokens", "fraction")


@dataclass(frozen=True, slots=True)
class Threshold:
    """One ``{type, value}`` rule (a summarization trigger or the keep rule)."""
    type: str
    value: float

    @classmethod
    def from_dict(cls, path: str, d: Any, types: tuple[str, ...], lo: int) -> Threshold:
        check_keys(path, d, {"type", "value"})
        if "type" not in d:
            raise ConfigError(f"{path}.type", f"missing (one of {', '.join(types)})")
        kind = get_str(path, d, "type", None, types)
        if "value" not in d:
            raise ConfigError(f"{path}.value", "missing")
        v = d["value"]
        if kind == "fraction":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ConfigError(f"{path}.value", f"expected a fraction in (0, 1], got {v!r}")
            return cls(kind, float(v))
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{path}.value", f"expected an integer >= {lo} ({kind}), got {v!r}")
        return cls(kind, v)


@dataclass(slots=True)
class SummarizationConfig:
    enabled: bool = True
    model: str | None = None                  # None: the session's chat model
    trigger: list[Threshold] = field(default_factory=lambda: [Threshold("tokens", 3000),
                                                              Threshold("messages", 40)])
    keep: Threshold = field(default_factory=lambda: Threshold("messages", 20))
    trim_tokens_to_summarize: int | None = 4000   # None: no trim (0 in the file means the same)
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    summary_prompt_file: str | None = None    # where summary_prompt was read from, if from a file
    max_failures_before_fallback: int = 3

    @classmethod
    def from_dict(cls, d: dict) -> SummarizationConfig:
        s = "summarization"
        check_keys(s, d, {"enabled", "model", "model_name", "trigger", "keep", "trim_tokens_to_summarize",
                          "summary_prompt", "summary_prompt_file", "max_failures_before_fallback"})
        model, alias = get_str(s, d, "model", None), get_str(s, d, "model_name", None)
        if model is not None and alias is not None and model != alias:
            raise ConfigError(f"{s}.model_name", f"is another name of {s}.model: set one of them "
                                                 f"(got model={model!r}, model_name={alias!r})")
        key = "model" if model is not None else "model_name"
        out = cls(enabled=get_bool(s, d, "enabled", True), model=model if model is not None else alias)
        if out.model is not None and not out.model.strip():
            raise ConfigError(f"{s}.{key}", "expected a model name or null, got an empty string")
        if "trigger" in d:
            raw = d["trigger"]
            items = [raw] if isinstance(raw, dict) else raw
            if not isinstance(items, list) or not items:
                raise ConfigError(f"{s}.trigger", f"expected a {{type, value}} table or a non-empty list of them, got {raw!r}")
            out.trigger = [Threshold.from_dict(f"{s}.trigger[{i}]" if isinstance(raw, list) else f"{s}.trigger",
                                               t, TRIGGER_TYPES, 1) for i, t in enumerate(items)]
        if "keep" in d:
            out.keep = Threshold.from_dict(f"{s}.keep", d["keep"], KEEP_TYPES, 0)
        trim = d.get("trim_tokens_to_summarize", 4000)          # null (or 0, for TOML) = no trim
        trim = None if trim is None else get_int(s, d, "trim_tokens_to_summarize", 4000, 0, 10_000_000)
        out.trim_tokens_to_summarize = trim or None
        prompt = get_str(s, d, "summary_prompt", DEFAULT_SUMMARY_PROMPT)
        if prompt is None or not prompt.strip():
            raise ConfigError(f"{s}.summary_prompt", "expected a non-empty string")
        out.summary_prompt = prompt
        path = get_str(s, d, "summary_prompt_file", None)
        if path is not None:
            if "summary_prompt" in d:
                raise ConfigError(f"{s}.summary_prompt_file", "set summary_prompt or summary_prompt_file, not both")
            out.summary_prompt, out.summary_prompt_file = read_prompt_file(f"{s}.summary_prompt_file", path), path
        out.max_failures_before_fallback = get_int(s, d, "max_failures_before_fallback", 3, 1, 1000)
        return out


def read_prompt_file(key: str, path: str) -> str:
    """The text of a prompt file (UTF-8, non-empty, at most MAX_PROMPT_FILE_BYTES), read at start-up."""
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes() if p.stat().st_size <= MAX_PROMPT_FILE_BYTES else None
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path!r}: {exc.strerror or exc}") from None
    if raw is None:
        raise ConfigError(key, f"{path!r} is larger than {MAX_PROMPT_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(key, f"{path!r} is not UTF-8 text") from None
    if not text.strip():
        raise ConfigError(key, f"{path!r} is empty")
    return text.strip()


@dataclass(slots=True)
class EmbeddingsConfig:
    """Optional OpenAI-compatible embeddings endpoint fused with BM25 (off by default)."""
    enabled: bool = False
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "NPLT_EMBEDDINGS_API_KEY"   # the *name* of the environment variable
    timeout_s: float = 10.0
    batch_size: int = 32

    @classmethod
    def from_dict(cls, d: dict) -> EmbeddingsConfig:
        s = "recall.embeddings"
        check_keys(s, d, {"enabled", "base_url", "model", "api_key_env", "timeout_s", "batch_size"})
        out = cls(enabled=get_bool(s, d, "enabled", False), base_url=get_str(s, d, "base_url", None),
                  model=get_str(s, d, "model", None),
                  api_key_env=get_str(s, d, "api_key_env", "NPLT_EMBEDDINGS_API_KEY") or "NPLT_EMBEDDINGS_API_KEY",
                  batch_size=get_int(s, d, "batch_size", 32, 1, 2048))
        t = d.get("timeout_s", 10.0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 600:
            raise ConfigError(f"{s}.timeout_s", f"expected seconds in (0, 600], got {t!r}")
        out.timeout_s = float(t)
        if out.enabled:
            for key in ("base_url", "model"):
                if not getattr(out, key):
                    raise ConfigError(f"{s}.{key}", "required when recall.embeddings.enabled is true")
            if not out.base_url.startswith(("http://", "https://")):     # type: ignore[union-attr]
                raise ConfigError(f"{s}.base_url", f"expected an http(s) URL, got {out.base_url!r}")
        return out


@dataclass(slots=True)
class RecallConfig:
    enabled: bool = True
    k: int = 4                        # excerpts per turn at most
    token_budget: int = 800           # tokens for all excerpts together
    max_users_cached: int = 256       # per-user indexes kept in memory (LRU; above the users active at once)
    max_sessions_indexed: int = 500   # most recent sessions of a user indexed for cross-session search
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)

    @classmethod
    def from_dict(cls, d: dict) -> RecallConfig:
        s = "recall"
        check_keys(s, d, {"enabled", "k", "token_budget", "max_users_cached", "max_sessions_indexed",
                          "embeddings"})
        return cls(enabled=get_bool(s, d, "enabled", True), k=get_int(s, d, "k", 4, 0, 50),
                   token_budget=get_int(s, d, "token_budget", 800, 0, 1_000_000),
                   max_users_cached=get_int(s, d, "max_users_cached", 256, 1, 100_000),
                   max_sessions_indexed=get_int(s, d, "max_sessions_indexed", 500, 1, 1_000_000),
                   embeddings=EmbeddingsConfig.from_dict(d.get("embeddings", {})))


@dataclass(slots=True)
class ContextConfig:
    recent_turns: int = 5
    max_input_tokens: int | None = None       # the model window; None: DEFAULT_WINDOW_TOKENS
    reserve_output_tokens: int = 1024
    max_sessions_cached: int = 256            # per-session views (uncovered messages) kept in memory
    token_counter: str = "auto"               # auto (tiktoken when installed, else estimate), estimate, tiktoken
    token_encoding: str = "o200k_base"        # the tiktoken encoding when tiktoken counts

    @property
    def window(self) -> int:
        return self.max_input_tokens if self.max_input_tokens is not None else DEFAULT_WINDOW_TOKENS

    @property
    def budget(self) -> int:
        """Tokens the assembled prompt may use."""
        return self.window - self.reserve_output_tokens

    @classmethod
    def from_dict(cls, d: dict) -> ContextConfig:
        s = "context"
        check_keys(s, d, {"recent_turns", "max_input_tokens", "reserve_output_tokens", "max_sessions_cached",
                          "token_counter", "token_encoding"})
        mit = d.get("max_input_tokens")
        out = cls(recent_turns=get_int(s, d, "recent_turns", 5, 0, 10_000),
                  max_input_tokens=None if mit is None else get_int(s, d, "max_input_tokens", 0, 512, 100_000_000),
                  reserve_output_tokens=get_int(s, d, "reserve_output_tokens", 1024, 0, 100_000_000),
                  max_sessions_cached=get_int(s, d, "max_sessions_cached", 256, 1, 100_000),
                  token_counter=get_str(s, d, "token_counter", "auto", TOKEN_COUNTERS),
                  token_encoding=get_str(s, d, "token_encoding", "o200k_base"))
        if out.token_counter == "tiktoken" and importlib.util.find_spec("tiktoken") is None:
            raise ConfigError(f"{s}.token_counter", "'tiktoken' is not installed (pip install "
                                                    "'nplt-assistant[tiktoken]'), or use 'auto' or 'estimate'")
        if not out.token_encoding.strip():
            raise ConfigError(f"{s}.token_encoding", "expected a tiktoken encoding name, e.g. o200k_base")
        if out.budget < MIN_PROMPT_BUDGET:
            raise ConfigError(f"{s}.reserve_output_tokens",
                              f"leaves {out.budget} tokens of the {out.window}-token window for the prompt "
                              f"(context.max_input_tokens - context.reserve_output_tokens must be >= {MIN_PROMPT_BUDGET})")
        return out


@dataclass(slots=True)
class UserMemoryConfig:
    """``[user_memory]``: long-term memory of each user's durable facts and preferences."""
    enabled: bool = True
    token_budget: int = 300          # tokens for the memory block of one prompt
    k: int = 8                       # items per prompt at most
    max_items: int = 200             # items kept per user (the oldest go first)
    max_users_cached: int = 256      # users whose items stay loaded (LRU; above the users active at once)
    root: str | None = None          # directory of the JSON files; None: "user_memory" next to storage.root

    @classmethod
    def from_dict(cls, d: dict) -> UserMemoryConfig:
        s = "user_memory"
        check_keys(s, d, {"enabled", "token_budget", "k", "max_items", "max_users_cached", "root"})
        return cls(enabled=get_bool(s, d, "enabled", True),
                   token_budget=get_int(s, d, "token_budget", 300, 0, 1_000_000),
                   k=get_int(s, d, "k", 8, 0, 100), max_items=get_int(s, d, "max_items", 200, 1, 100_000),
                   max_users_cached=get_int(s, d, "max_users_cached", 256, 1, 100_000),
                   root=get_str(s, d, "root", None))


@dataclass(slots=True)
class MemoryConfig:
    summarization: SummarizationConfig = field(default_factory=SummarizationConfig)
    recall: RecallConfig = field(default_factory=RecallConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    user_memory: UserMemoryConfig = field(default_factory=UserMemoryConfig)

    @classmethod
    def from_dict(cls, d: dict) -> MemoryConfig:
        """From ``{"summarization": {...}, "recall": {...}, "context": {...}, "user_memory": {...}}``
        (each optional)."""
        check_keys("memory", d, {"summarization", "recall", "context", "user_memory"})
        out = cls(summarization=SummarizationConfig.from_dict(d.get("summarization", {})),
                  recall=RecallConfig.from_dict(d.get("recall", {})),
                  context=ContextConfig.from_dict(d.get("context", {})),
                  user_memory=UserMemoryConfig.from_dict(d.get("user_memory", {})))
        out.validate()
        return out

    def validate(self) -> None:
        """Rules spanning sections: a fraction needs the model window configured."""
        if self.context.max_input_tokens is not None:
            return
        sm = self.summarization
        for i, t in enumerate(sm.trigger):
            if t.type == "fraction":
                key = "summarization.trigger" if len(sm.trigger) == 1 else f"summarization.trigger[{i}]"
                raise ConfigError(key, "type 'fraction' needs context.max_input_tokens to be set "
                                       "(the fraction is a share of the model's input window)")
        if sm.keep.type == "fraction":
            raise ConfigError("summarization.keep", "type 'fraction' needs context.max_input_tokens to be set "
                                                    "(the fraction is a share of the model's input window)")

"""Memory configuration: the ``[summarization]``, ``[recall]``, ``[context]`` and ``[user_memory]`` sections.

Each section is a pydantic model (``server.config_base.Section``) raising ``ConfigError`` with the
offending key; ``MemoryConfig.from_dict({"summarization": {...}, "recall": {...}, ...})`` also checks
the rules that span sections (a ``fraction`` trigger or keep needs ``context.max_input_tokens``).
Defaults and meanings are listed in docs/memory.md.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from protocol.settings import Invalid
from server.config_base import Section

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
DEFAULT_MAX_SUMMARY_TOKENS = 2000  # summarization.max_summary_tokens


class Threshold(Section):
    """One ``{type, value}`` rule (a summarization trigger or the keep rule)."""
    model_config = ConfigDict(frozen=True)
    type: Literal["tokens", "messages", "fraction"]
    value: int | float      # an integer count (tokens, messages), or a share of the window in (0, 1]

    @field_validator("value", mode="before")
    @classmethod
    def _fits_type(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("type")
        if kind == "fraction" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
            raise Invalid(f"expected a fraction in (0, 1], got {v!r}")
        if kind in ("tokens", "messages") and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise Invalid(f"expected an integer >= 0 ({kind}), got {v!r}")
        return float(v) if kind == "fraction" else v


class SummarizationConfig(Section):
    section: ClassVar[str] = "summarization"
    enabled: bool = True
    model: str | None = Field(None, validation_alias=AliasChoices("model", "model_name"))   # None: the chat model
    trigger: list[Threshold] = Field(default_factory=lambda: [Threshold(type="tokens", value=3000),
                                                                   Threshold(type="messages", value=40)])
    keep: Threshold = Threshold(type="messages", value=20)
    trim_tokens_to_summarize: int | None = Field(4000, ge=0, le=10_000_000)   # None (or 0): no trim
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    summary_prompt_file: str | None = None    # read into summary_prompt at load
    max_failures_before_fallback: int = Field(3, ge=1, le=1000)
    # a model-written summary counting more tokens is refused (a failed summary: the previous one
    # stays); the request asks for at most about a quarter as many words. 2000: above the summary
    # request's default output limit ([llm] max_tokens 1024) with room for the estimator counting
    # up to ~2x generously, and a sixth of the default prompt budget (every prompt carries it)
    max_summary_tokens: int = Field(DEFAULT_MAX_SUMMARY_TOKENS, ge=64, le=1_000_000)

    @model_validator(mode="before")
    @classmethod
    def _model_name_is_model(cls, d: Any) -> Any:
        """``model_name`` is another name of ``model``: both may be given only with the same value."""
        if isinstance(d, dict) and "model" in d and "model_name" in d:
            if d["model"] != d["model_name"]:
                raise Invalid(f"is another name of summarization.model: set one of them (got model={d['model']!r}, "
                              f"model_name={d['model_name']!r})", "model_name")
            d = {k: v for k, v in d.items() if k != "model_name"}
        return d

    @field_validator("model")
    @classmethod
    def _model_named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise Invalid("expected a model name or null, got an empty string")
        return v

    @field_validator("trigger", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        items = [v] if isinstance(v, dict) else v
        if not isinstance(items, list) or not items:
            raise Invalid(f"expected a {{type, value}} table or a non-empty list of them, got {v!r}")
        return items

    @field_validator("trigger")
    @classmethod
    def _counts_from_one(cls, v: list[Threshold]) -> list[Threshold]:
        for i, t in enumerate(v):
            if t.type != "fraction" and t.value < 1:
                raise Invalid(f"expected an integer >= 1 ({t.type}), got {t.value!r}", i, "value")
        return v

    @field_validator("trim_tokens_to_summarize")
    @classmethod
    def _zero_is_none(cls, v: int | None) -> int | None:
        return v or None

    @field_validator("summary_prompt")
    @classmethod
    def _prompt_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise Invalid("expected a non-empty string")
        return v

    @model_validator(mode="after")
    def _prompt_file(self) -> SummarizationConfig:
        if self.summary_prompt_file is not None:
            if "summary_prompt" in self.model_fields_set:
                raise Invalid("set summary_prompt or summary_prompt_file, not both", "summary_prompt_file")
            self.summary_prompt = read_prompt_file(self.summary_prompt_file)
        return self


def read_prompt_file(path: str) -> str:
    """The text of a prompt file (UTF-8, non-empty, at most MAX_PROMPT_FILE_BYTES), read at start-up."""
    key = "summary_prompt_file"
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes() if p.stat().st_size <= MAX_PROMPT_FILE_BYTES else None
    except OSError as exc:
        raise Invalid(f"cannot read {path!r}: {exc.strerror or exc}", key) from None
    if raw is None:
        raise Invalid(f"{path!r} is larger than {MAX_PROMPT_FILE_BYTES} bytes", key)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid(f"{path!r} is not UTF-8 text", key) from None
    if not text.strip():
        raise Invalid(f"{path!r} is empty", key)
    return text.strip()


class EmbeddingsConfig(Section):
    """Optional OpenAI-compatible embeddings endpoint fused with BM25 (off by default)."""
    section: ClassVar[str] = "recall.embeddings"
    enabled: bool = False
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "NPLT_EMBEDDINGS_API_KEY"   # the *name* of the environment variable ("": this default)
    timeout_s: float = Field(10.0, gt=0, le=600)
    batch_size: int = Field(32, ge=1, le=2048)

    @field_validator("api_key_env")
    @classmethod
    def _empty_is_default(cls, v: str) -> str:
        return v or cls.model_fields["api_key_env"].default

    @model_validator(mode="after")
    def _endpoint_when_enabled(self) -> EmbeddingsConfig:
        if self.enabled:
            for key in ("base_url", "model"):
                if not getattr(self, key):
                    raise Invalid("required when embeddings are enabled (enabled = true)", key)
            if not self.base_url.startswith(("http://", "https://")):     # type: ignore[union-attr]
                raise Invalid(f"expected an http(s) URL, got {self.base_url!r}", "base_url")
        return self


class RecallConfig(Section):
    section: ClassVar[str] = "recall"
    enabled: bool = True
    k: int = Field(4, ge=0, le=50)                             # excerpts per turn at most
    token_budget: int = Field(800, ge=0, le=1_000_000)         # tokens for all excerpts together
    max_users_cached: int = Field(256, ge=1, le=100_000)       # per-user indexes kept in memory (LRU; above the users active at once)
    max_sessions_indexed: int = Field(500, ge=1, le=1_000_000)   # most recent sessions of a user indexed
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)


class ContextConfig(Section):
    section: ClassVar[str] = "context"
    recent_turns: int = Field(5, ge=0, le=10_000)
    max_input_tokens: int | None = Field(None, ge=512, le=100_000_000)   # the model window; None: DEFAULT_WINDOW_TOKENS
    reserve_output_tokens: int = Field(1024, ge=0, le=100_000_000)
    max_sessions_cached: int = Field(256, ge=1, le=100_000)   # per-session views (uncovered messages) kept in memory
    # auto (tiktoken when installed, else estimate), estimate, tiktoken
    token_counter: Literal["auto", "estimate", "tiktoken"] = "auto"
    token_encoding: str = "o200k_base"        # the tiktoken encoding when tiktoken counts

    @property
    def window(self) -> int:
        return self.max_input_tokens if self.max_input_tokens is not None else DEFAULT_WINDOW_TOKENS

    @property
    def budget(self) -> int:
        """Tokens the assembled prompt may use."""
        return self.window - self.reserve_output_tokens

    @model_validator(mode="after")
    def _usable(self) -> ContextConfig:
        if self.token_counter == "tiktoken" and importlib.util.find_spec("tiktoken") is None:
            raise Invalid("'tiktoken' is not installed (pip install 'nplt-assistant[tiktoken]'), or use 'auto' "
                          "or 'estimate'", "token_counter")
        if not self.token_encoding.strip():
            raise Invalid("expected a tiktoken encoding name, e.g. o200k_base", "token_encoding")
        if self.budget < MIN_PROMPT_BUDGET:
            raise Invalid(f"leaves {self.budget} tokens of the {self.window}-token window for the prompt "
                          f"(context.max_input_tokens - context.reserve_output_tokens must be >= {MIN_PROMPT_BUDGET})",
                          "reserve_output_tokens")
        return self


class UserMemoryConfig(Section):
    """``[user_memory]``: long-term memory of each user's durable facts and preferences."""
    section: ClassVar[str] = "user_memory"
    enabled: bool = True
    token_budget: int = Field(300, ge=0, le=1_000_000)   # tokens for the memory block of one prompt
    k: int = Field(8, ge=0, le=100)                      # items per prompt at most
    max_items: int = Field(200, ge=1, le=100_000)        # items kept per user (the oldest go first)
    max_users_cached: int = Field(256, ge=1, le=100_000) # users whose items stay loaded (LRU; above the users active at once)
    root: str | None = None          # directory of the JSON files; None: "user_memory" next to storage.root


class MemoryConfig(Section):
    """The four memory sections; built from ``{"summarization": {...}, "recall": {...}, ...}`` (each optional)."""
    summarization: SummarizationConfig = Field(default_factory=SummarizationConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    context: ContextConfig = Field(default_factory=ContextConfig)
    user_memory: UserMemoryConfig = Field(default_factory=UserMemoryConfig)

    @model_validator(mode="after")
    def _fractions_need_a_window(self) -> MemoryConfig:
        """Rules spanning sections: a fraction is a share of the model window, which must be configured."""
        if self.context.max_input_tokens is not None:
            return self
        why = "type 'fraction' needs context.max_input_tokens to be set (the fraction is a share of the model's input window)"
        for i, t in enumerate(self.summarization.trigger):
            if t.type == "fraction":
                raise Invalid(why, "summarization", "trigger", i)
        if self.summarization.keep.type == "fraction":
            raise Invalid(why, "summarization", "keep")
        return self

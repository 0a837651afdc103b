"""The [llm] and [agent] config sections, and the named provider profiles.

A provider profile fills in base_url and model, so two environment variables are enough:
``NPLT_LLM_PROVIDER=deepseek NPLT_LLM_API_KEY=sk-...``. The API key is resolved from
``NPLT_LLM_API_KEY``, then the config file, then ``OPENAI_API_KEY``; it never appears in a repr.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from server.config_base import ConfigError, check_keys, get_bool, get_float, get_int, get_str, get_str_list


@dataclass(frozen=True, slots=True)
class Provider:
    """Defaults for one OpenAI-compatible service."""
    name: str
    base_url: str
    model: str
    needs_key: bool = True
    models: tuple[str, ...] = ()


PROVIDERS: dict[str, Provider] = {
    "openai": Provider("openai", "https://api.openai.com/v1", "gpt-4o-mini", models=("gpt-4o",)),
    "deepseek": Provider("deepseek", "https://api.deepseek.com/v1", "deepseek-chat", models=("deepseek-reasoner",)),
    "zhipu": Provider("zhipu", "https://open.bigmodel.cn/api/paas/v4", "glm-4-flash", models=("glm-4-plus",)),
    "ollama": Provider("ollama", "http://127.0.0.1:11434/v1", "qwen2.5:7b", needs_key=False),
    "vllm": Provider("vllm", "http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-7B-Instruct", needs_key=False),
}

ENV_KEYS = ("NPLT_LLM_API_KEY", "OPENAI_API_KEY")

DEFAULT_SYSTEM_PROMPT = (
    "You are NPLT Assistant, an operations assistant for the machine this server runs on. "
    "You have read-only tools: sys_monitor (CPU, memory, disks, network, load, uptime), processes "
    "(top processes), network_check (TCP reachability of allowed hosts), read_log (tail of allowlisted "
    "log files), history_search (this user's earlier conversations) and clock. Use them instead of "
    "guessing: never invent numbers. You cannot change anything on the machine; say so when asked. "
    "Be concise and concrete. Answer in the user's language (Chinese or English)."
)

_LLM_KEYS = {"provider", "base_url", "api_key", "model", "models", "temperature", "max_tokens",
             "request_timeout_s", "retries", "retry_backoff_s", "retry_max_delay_s",
             "models_from_endpoint", "models_refresh_s", "models_timeout_s"}
_AGENT_KEYS = {"system_prompt", "max_iterations", "tool_timeout_s", "stream_chunk_chars"}


@dataclass(slots=True)
class LLMConfig:
    """How to reach the model endpoint. ``api_key`` is a secret: excluded from repr and never logged."""
    provider: str | None = None
    base_url: str | None = None                          # None: the provider profile's URL
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None
    models: list[str] = field(default_factory=list)      # extra models offered for switching
    temperature: float = 0.3
    max_tokens: int = 1024
    request_timeout_s: float = 60.0
    retries: int = 3
    retry_backoff_s: float = 0.5
    retry_max_delay_s: float = 20.0
    models_from_endpoint: bool = True    # merge the endpoint's GET /models list into the offered models
    models_refresh_s: float = 300.0      # how long a fetched model list is kept
    models_timeout_s: float = 5.0        # bound on one GET /models (done in the background)

    def __repr__(self) -> str:
        key = "set" if self.api_key else "unset"
        return (f"LLMConfig(provider={self.provider!r}, base_url={self.base_url!r}, model={self.model!r}, "
                f"api_key=<{key}>, models={self.models!r})")

    __str__ = __repr__

    @property
    def profile(self) -> Provider | None:
        return PROVIDERS.get(self.provider) if self.provider else None

    @property
    def keyless(self) -> bool:
        """True when the endpoint is a local server that needs no key (ollama, vllm, loopback URL)."""
        if self.profile is not None and not self.profile.needs_key:
            return True
        url = self.effective_base_url.lower()
        return any(h in url for h in ("://127.0.0.1", "://localhost", "://[::1]"))

    @property
    def usable(self) -> bool:
        """Enough is configured to talk to a real model: a key, an explicit base_url, or a keyless profile."""
        return bool(self.api_key) or self.base_url is not None or (self.profile is not None and self.keyless)

    @property
    def effective_base_url(self) -> str:
        """The configured base_url, else the provider profile's, else OpenAI's."""
        return self.base_url or (self.profile or PROVIDERS["openai"]).base_url

    @property
    def effective_model(self) -> str:
        return self.model or (self.profile.model if self.profile else PROVIDERS["openai"].model)

    def all_models(self) -> list[str]:
        """The configured model first, then the extra models (configured, else the profile's), deduplicated."""
        extra = self.models or (list(self.profile.models) if self.profile else [])
        out: list[str] = []
        for m in [self.effective_model, *extra]:
            if m and m not in out:
                out.append(m)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], env: Mapping[str, str] | None = None) -> LLMConfig:
        """Read the [llm] section; ``env`` (default os.environ) supplies NPLT_LLM_* overrides and the key."""
        env = os.environ if env is None else env
        check_keys("llm", d, _LLM_KEYS)
        d = dict(d)
        for key in ("provider", "base_url", "model"):
            value = env.get(f"NPLT_LLM_{key.upper()}")
            if value:
                d[key] = value
        provider = get_str("llm", d, "provider", None)
        if provider is not None:
            provider = provider.strip().lower()
            if provider not in PROVIDERS:
                raise ConfigError("llm.provider", f"expected one of {', '.join(PROVIDERS)}, got {provider!r}")
        base_url = get_str("llm", d, "base_url", None)
        if base_url is not None:
            base_url = base_url.strip().rstrip("/")
            if not base_url.startswith(("http://", "https://")):
                raise ConfigError("llm.base_url", f"expected an http:// or https:// URL, got {base_url!r}")
        api_key = env.get("NPLT_LLM_API_KEY") or get_str("llm", d, "api_key", None) or env.get("OPENAI_API_KEY")
        return cls(
            provider=provider, base_url=base_url, api_key=(api_key or "").strip() or None,
            model=get_str("llm", d, "model", None),
            models=get_str_list("llm", d, "models", []),
            temperature=get_float("llm", d, "temperature", 0.3, 0.0, 2.0),
            max_tokens=get_int("llm", d, "max_tokens", 1024, 1, 1_000_000),
            request_timeout_s=get_float("llm", d, "request_timeout_s", 60.0, 0.05, 3600.0),
            retries=get_int("llm", d, "retries", 3, 0, 10),
            retry_backoff_s=get_float("llm", d, "retry_backoff_s", 0.5, 0.0, 60.0),
            retry_max_delay_s=get_float("llm", d, "retry_max_delay_s", 20.0, 0.0, 600.0),
            models_from_endpoint=get_bool("llm", d, "models_from_endpoint", True),
            models_refresh_s=get_float("llm", d, "models_refresh_s", 300.0, 1.0, 86400.0),
            models_timeout_s=get_float("llm", d, "models_timeout_s", 5.0, 0.05, 120.0),
        )


@dataclass(slots=True)
class AgentConfig:
    """Agent behaviour: system prompt, tool loop bound, per-tool timeout, offline streaming chunk size."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_iterations: int = 6
    tool_timeout_s: float = 15.0
    stream_chunk_chars: int = 24

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentConfig:
        check_keys("agent", d, _AGENT_KEYS)
        prompt = get_str("agent", d, "system_prompt", DEFAULT_SYSTEM_PROMPT)
        if not prompt.strip():
            raise ConfigError("agent.system_prompt", "expected a non-empty string")
        return cls(
            system_prompt=prompt,
            max_iterations=get_int("agent", d, "max_iterations", 6, 1, 50),
            tool_timeout_s=get_float("agent", d, "tool_timeout_s", 15.0, 0.1, 600.0),
            stream_chunk_chars=get_int("agent", d, "stream_chunk_chars", 24, 1, 10_000),
        )

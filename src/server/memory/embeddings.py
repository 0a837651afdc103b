"""Optional embeddings for recall: an OpenAI-compatible ``/embeddings`` endpoint via ``openai.AsyncOpenAI``.

Off by default (``[recall.embeddings] enabled = false``). When on, each indexed turn is embedded
in the background and each recall query once; the vector ranking is fused with BM25 by
reciprocal rank fusion. Any failure (network, timeout, bad reply) only disables the vector half
for that call: recall falls back to BM25 alone.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from server.memory.config import EmbeddingsConfig

log = logging.getLogger("nplt.memory.embeddings")
MAX_INPUT_CHARS = 8000         # per text sent for embedding


class EmbeddingError(Exception):
    """The embeddings endpoint failed or replied with something unusable."""


class Embedder:
    """Thin async wrapper over ``client.embeddings.create`` (the API key is read from the named env var)."""

    def __init__(self, config: EmbeddingsConfig, env: Mapping[str, str] | None = None) -> None:
        from openai import AsyncOpenAI
        env = os.environ if env is None else env
        self.config = config
        self.client = AsyncOpenAI(base_url=config.base_url, api_key=env.get(config.api_key_env) or "unused",
                                  timeout=config.timeout_s, max_retries=1)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order; raises EmbeddingError."""
        if not texts:
            return []
        try:
            resp = await self.client.embeddings.create(model=str(self.config.model),
                                                       input=[t[:MAX_INPUT_CHARS] or " " for t in texts])
        except Exception as exc:
            raise EmbeddingError(f"embeddings request failed ({type(exc).__name__})") from exc
        data: list[Any] = sorted(resp.data, key=lambda d: d.index)
        if len(data) != len(texts) or any(not d.embedding for d in data):
            raise EmbeddingError(f"expected {len(texts)} embeddings, got {len(data)}")
        return [[float(x) for x in d.embedding] for d in data]

    async def aclose(self) -> None:
        await self.client.close()

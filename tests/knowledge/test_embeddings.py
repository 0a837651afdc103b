"""Hybrid retrieval: BM25 fused with vectors from an OpenAI-compatible embeddings endpoint (the real
``openai`` client against a scripted server on loopback); an endpoint failure falls back to BM25."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "memory"))

from memory_testlib import EmbeddingServer  # noqa: E402

from server.knowledge import KnowledgeBase, KnowledgeConfig  # noqa: E402
from server.memory.config import EmbeddingsConfig  # noqa: E402


def config(url: str) -> KnowledgeConfig:
    return KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=20,
                           embeddings=EmbeddingsConfig(enabled=True, base_url=url, model="emb", batch_size=2))


async def test_vectors_find_what_words_cannot_and_survive_restart(tmp_path):
    async with EmbeddingServer() as server:
        kb = KnowledgeBase(config(server.base_url), tmp_path / "kb")
        await kb.start()
        try:
            for name, text in [("fleet.md", "# Fleet\n\nEvery automobile is serviced in March."),
                               ("pets.md", "# Pets\n\nThe puppy sleeps in the garden."),
                               ("misc.md", "# Misc\n\nThe printer jams on Mondays.")]:
                await kb.ingest("alice", [], None, name, text.encode())
            assert server.requests == 3
            hits = await kb.search("alice", [], "car", 2)        # no word in common with the fleet document
            assert hits and hits[0].name == "fleet.md"
            assert (await kb.search("alice", [], "hound", 1))[0].name == "pets.md"
            assert (await kb.search("bob", [], "car", 2)) == []  # vectors obey isolation too
            server.fail = True                                   # endpoint down: BM25 alone still answers
            assert (await kb.search("alice", [], "printer", 1))[0].name == "misc.md"
            info = await kb.ingest("alice", [], None, "late.md", b"# Late\n\nThe vehicle log.")
            assert info.chunks == 1                              # ingested without vectors
        finally:
            await kb.close()
        server.fail = False
        kb = KnowledgeBase(config(server.base_url), tmp_path / "kb")     # vectors are stored with the document
        await kb.start()
        try:
            assert (await kb.search("alice", [], "car", 1))[0].name == "fleet.md"
        finally:
            await kb.close()

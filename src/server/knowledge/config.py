"""``[knowledge]`` settings: limits, chunking and retrieval knobs, each with a safe default."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from server.config_base import check_keys, get_float, get_int
from server.memory.config import EmbeddingsConfig

MIB = 1024 * 1024


@dataclass(slots=True)
class KnowledgeConfig:
    max_upload_bytes: int = 100 * MIB          # one document
    user_quota_bytes: int = 1024 * MIB         # all documents one user uploaded, every collection
    max_chunks_per_document: int = 50_000
    max_documents_per_collection: int = 10_000
    chunk_target_chars: int = 600              # a chunk grows by whole paragraphs/sentences up to this
    chunk_overlap_chars: int = 100             # tail of the previous chunk of the same section repeated
    max_extracted_chars: int = 50_000_000      # text a parser may produce from one document
    docx_max_uncompressed_bytes: int = 256 * MIB
    docx_max_ratio: int = 200                  # uncompressed / compressed, per member of the zip
    docx_max_members: int = 2_000
    pdf_max_pages: int = 5_000
    ingest_workers: int = 2                    # threads parsing and indexing uploads
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    title_weight: float = 1.0                  # weight of the heading path's terms in a chunk's bag
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    # the v3 upload (docs/protocol.md §5.8, server.handlers.knowledge_uploads)
    max_uploads_per_user: int = 4              # uploads in progress (BEGIN..END) per user
    max_uploads: int = 32                      # ... on the whole server
    upload_expiry_s: int = 86_400              # a partial upload is kept this long after its last byte
    upload_buffer_bytes: int = 8 * MIB         # received bytes not yet written before reading pauses

    @classmethod
    def from_dict(cls, d: dict) -> KnowledgeConfig:
        s = "knowledge"
        names = {f.name for f in dataclasses.fields(cls)}
        check_keys(s, d, names)
        out = cls()
        ints = {"max_upload_bytes": (1, 1 << 40), "user_quota_bytes": (0, 1 << 44),
                "max_chunks_per_document": (1, 10_000_000), "max_documents_per_collection": (1, 10_000_000),
                "chunk_target_chars": (50, 100_000), "chunk_overlap_chars": (0, 50_000),
                "max_extracted_chars": (1, 1 << 33), "docx_max_uncompressed_bytes": (1, 1 << 40),
                "docx_max_ratio": (1, 100_000), "docx_max_members": (1, 1_000_000),
                "pdf_max_pages": (1, 1_000_000), "ingest_workers": (1, 64),
                "max_uploads_per_user": (1, 1000), "max_uploads": (1, 100_000),
                "upload_expiry_s": (1, 365 * 86_400), "upload_buffer_bytes": (1 << 16, 1 << 30)}
        for key, (lo, hi) in ints.items():
            setattr(out, key, get_int(s, d, key, getattr(out, key), lo, hi))
        out.bm25_k1 = get_float(s, d, "bm25_k1", out.bm25_k1, 0.0, 10.0)
        out.bm25_b = get_float(s, d, "bm25_b", out.bm25_b, 0.0, 1.0)
        out.title_weight = get_float(s, d, "title_weight", out.title_weight, 0.0, 10.0)
        if out.chunk_overlap_chars >= out.chunk_target_chars:
            from server.config_base import ConfigError
            raise ConfigError(f"{s}.chunk_overlap_chars", "must be smaller than chunk_target_chars")
        out.embeddings = EmbeddingsConfig.from_dict(d.get("embeddings", {}))
        return out

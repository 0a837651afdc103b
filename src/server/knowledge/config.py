"""``[knowledge]`` settings: limits, chunking and retrieval knobs, each with a safe default."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from protocol.settings import Invalid
from server.config_base import Section
from server.memory.config import EmbeddingsConfig

MIB = 1024 * 1024
#: ``max_documents_per_member`` when not set: ``max_documents_per_collection`` divided by this
DOCUMENTS_PER_MEMBER_SHARE = 4


class KnowledgeConfig(Section):
    section: ClassVar[str] = "knowledge"
    max_upload_bytes: int = Field(100 * MIB, ge=1, le=1 << 40)   # one document
    user_quota_bytes: int = Field(1024 * MIB, ge=0, le=1 << 44)  # all documents one user uploaded, every collection
    max_chunks_per_document: int = Field(50_000, ge=1, le=10_000_000)
    max_documents_per_collection: int = Field(10_000, ge=1, le=10_000_000)
    # documents one member may upload into one group collection (QUOTA_EXCEEDED beyond), so that one
    # member cannot fill max_documents_per_collection for the whole group; None (the default): a
    # quarter of max_documents_per_collection (2,500), so at least four members are needed to fill
    # it (``documents_per_member``). Personal collections have only max_documents_per_collection
    max_documents_per_member: int | None = Field(None, ge=1, le=10_000_000)
    # chunks in the whole index, every collection (QUOTA_EXCEEDED beyond): the in-memory index takes
    # ~5.6 KB of RSS per chunk, so 1,000,000 chunks is ~5.6 GB; the per-user byte quota alone would
    # allow ~1.8 M chunks (~10 GB) to each user: max_chunks_per_user bounds a user's share
    max_total_chunks: int = Field(1_000_000, ge=1, le=1 << 40)
    # chunks of the documents one user uploaded, personal and group collections together (QUOTA_EXCEEDED
    # beyond), so that one user cannot fill max_total_chunks for everyone: 100,000 (~560 MB of index,
    # ~60 M characters of text) is a tenth of the default max_total_chunks, so at least ten users are
    # needed to fill the index. A fixed number, not a share: a smaller max_total_chunks binds first
    # (lower this with it to keep the share)
    max_chunks_per_user: int = Field(100_000, ge=1, le=1 << 40)
    chunk_target_chars: int = Field(600, ge=50, le=100_000)   # a chunk grows by whole paragraphs/sentences up to this
    chunk_overlap_chars: int = Field(100, ge=0, le=50_000)    # tail of the previous chunk of the same section repeated
    max_extracted_chars: int = Field(50_000_000, ge=1, le=1 << 33)   # text a parser may produce from one document
    docx_max_uncompressed_bytes: int = Field(256 * MIB, ge=1, le=1 << 40)
    docx_max_ratio: int = Field(200, ge=1, le=100_000)        # uncompressed / compressed, per member of the zip
    docx_max_members: int = Field(2_000, ge=1, le=1_000_000)
    docx_max_xml_elements: int = Field(2_000_000, ge=1, le=1 << 33)   # xml elements read from one docx, all its parts
    csv_max_record_chars: int = Field(1 << 20, ge=1, le=1 << 33)      # one csv record: a row and the lines its quoted cells span
    html_max_tags: int = Field(1_000_000, ge=1, le=1 << 33)   # start and end tags read from one html file (~5 µs each)
    pdf_max_pages: int = Field(5_000, ge=1, le=1_000_000)
    pdf_max_page_chars: int = Field(200_000, ge=1, le=1 << 33)       # text extracted from one pdf page
    pdf_max_stream_bytes: int = Field(8 * MIB, ge=1 << 16, le=1 << 34)   # one pdf stream, decompressed
    pdf_max_content_bytes: int = Field(32 * MIB, ge=1 << 16, le=1 << 40)  # page content interpreted, whole pdf
    ingest_workers: int = Field(2, ge=1, le=64)               # threads parsing and indexing uploads
    max_running_ingests_per_user: int = Field(1, ge=1, le=64)   # a user's ingests on threads at once (< ingest_workers)
    max_ingests_per_user: int = Field(4, ge=1, le=1000)        # a user's ingests running or waiting (QUOTA_EXCEEDED beyond)
    bm25_k1: float = Field(1.2, ge=0.0, le=10.0)
    bm25_b: float = Field(0.75, ge=0.0, le=1.0)
    title_weight: float = Field(1.0, ge=0.0, le=10.0)         # weight of the heading path's terms in a chunk's bag
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    # the v3 upload (docs/protocol.md §5.8, server.handlers.knowledge_uploads)
    max_uploads_per_user: int = Field(4, ge=1, le=1000)       # uploads in progress (BEGIN..END) per user
    max_uploads: int = Field(32, ge=1, le=100_000)            # ... on the whole server
    upload_expiry_s: int = Field(86_400, ge=1, le=365 * 86_400)   # a partial upload is kept this long after its last byte
    upload_buffer_bytes: int = Field(8 * MIB, ge=1 << 16, le=1 << 30)   # received bytes not yet written before reading pauses
    upload_share_bytes: int = Field(1 * MIB, ge=1 << 16, le=1 << 30)   # PostgreSQL: received bytes shared per piece

    @model_validator(mode="after")
    def _overlap_below_target(self) -> KnowledgeConfig:
        if self.chunk_overlap_chars >= self.chunk_target_chars:
            raise Invalid("must be smaller than chunk_target_chars", "chunk_overlap_chars")
        return self

    @property
    def documents_per_member(self) -> int:
        """``max_documents_per_member``, or a quarter of ``max_documents_per_collection`` when it is not set."""
        if self.max_documents_per_member is not None:
            return self.max_documents_per_member
        return max(1, self.max_documents_per_collection // DOCUMENTS_PER_MEMBER_SHARE)

    @property
    def user_ingest_threads(self) -> int:
        """Threads one user's ingests may hold at once: ``max_running_ingests_per_user``, but always
        leaving one of ``ingest_workers`` to the other users (when there are two or more)."""
        return max(1, min(self.max_running_ingests_per_user, self.ingest_workers - 1))

"""Public records of the knowledge base."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from server.knowledge.chunker import citation


@dataclass(slots=True, frozen=True)
class DocumentInfo:
    doc_id: str
    name: str
    md5: str
    sha256: str
    size: int
    chunks: int
    collection: str
    uploaded_at: str
    uploader: str
    #: in a group collection, the other members who uploaded the same bytes, in upload order: the
    #: uploader's delete passes the document to the first of them (docs/knowledge.md "Duplicates")
    co_uploaders: tuple[str, ...] = ()
    duplicate: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class Hit:
    doc_id: str
    name: str
    chunk_id: str            # "<doc_id>:<n>"
    text: str
    score: float
    location: dict           # {"heading": [...], "page": n, "lines": [a, b]}, each part optional
    collection: str

    @property
    def citation(self) -> str:
        """``[name §location]``."""
        return citation(self.name, self.location)

    def to_dict(self) -> dict:
        return {**asdict(self), "citation": self.citation}

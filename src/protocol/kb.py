"""Typed knowledge-base bodies (docs/protocol.md §5.8): requests, their replies, the KB_PROGRESS event.

Requests have ``from_body(dict)`` like ``protocol.messages`` (ProtocolError INVALID_MESSAGE naming
the field); replies and the event are frozen ``Wire`` dataclasses with ``encode()`` / ``decode()``
like ``protocol.replies``. The file bytes themselves travel in binary data frames
(``protocol.binary``), never in these JSON bodies.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from .codes import MsgType
from .fields import Addressed, Fields, RequestId, Wire, addressed, id_problem, invalid, valid_request_id

MAX_FILE_NAME_CHARS = 1024      # the server keeps at most 255 characters of a base name
MAX_KB_QUERY_CHARS = 1000
MAX_KB_REF_CHARS = 128          # doc ids, chunk ids, upload ids, collection names
MAX_KB_LIMIT = 100
MAX_KB_CURSOR_CHARS = 256       # KB_LIST's ``before`` (an opaque cursor from a KB_LIST reply)
PROGRESS_STAGES = ("receiving", "parsing", "chunking", "indexing")
_MD5 = re.compile(r"[0-9a-fA-F]{32}")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _id(f: Fields) -> RequestId:
    value = f.body.get("id")
    if "id" not in f.body:
        raise invalid("id", "missing (every request carries an id)")
    if not valid_request_id(value):
        raise id_problem(value)
    return value


def _text(f: Fields, key: str, hi: int, *, optional: bool = False) -> str | None:
    value = f.text(key, optional=optional)
    if value is None:
        return None
    if not value or len(value) > hi:
        raise invalid(key, f"expected a string of 1..{hi} characters, got {len(value)} characters")
    return value


def _hex(f: Fields, key: str, pattern: re.Pattern[str], digits: int, *, optional: bool = False) -> str | None:
    value = f.text(key, optional=optional)
    if value is None:
        return None
    if not pattern.fullmatch(value):
        raise invalid(key, f"expected {digits} hex digits")
    return value.lower()


# -- requests ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class KbUploadBegin:
    """Start (or resume) an upload. The reply's ``offset`` is where the data frames continue."""
    id: RequestId
    name: str
    size: int
    md5: str
    sha256: str | None = None
    collection: str | None = None

    @classmethod
    def from_body(cls, body: Any) -> KbUploadBegin:
        f = Fields(body)
        return cls(_id(f), _text(f, "name", MAX_FILE_NAME_CHARS), f.integer("size"),  # type: ignore[arg-type]
                   _hex(f, "md5", _MD5, 32), _hex(f, "sha256", _SHA256, 64, optional=True),  # type: ignore[arg-type]
                   _text(f, "collection", MAX_KB_REF_CHARS, optional=True))


@dataclass(slots=True)
class KbUploadEnd:
    """Every byte was sent: verify, then parse, chunk and index (KB_PROGRESS events meanwhile)."""
    id: RequestId
    upload_id: str

    @classmethod
    def from_body(cls, body: Any) -> KbUploadEnd:
        f = Fields(body)
        return cls(_id(f), _text(f, "upload_id", MAX_KB_REF_CHARS))  # type: ignore[arg-type]


@dataclass(slots=True)
class KbList:
    """Newest first. ``before``: the ``next_before`` cursor of the previous page (opaque); ``limit``:
    at most this many (the server caps it at its ``max_page_size``). Without ``limit`` the reply holds
    every document that fits in one message, ``has_more`` telling whether there are others."""
    id: RequestId
    collection: str | None = None
    before: str | None = None
    limit: int | None = None

    @classmethod
    def from_body(cls, body: Any) -> KbList:
        f = Fields(body)
        return cls(_id(f), _text(f, "collection", MAX_KB_REF_CHARS, optional=True),
                   _text(f, "before", MAX_KB_CURSOR_CHARS, optional=True), f.integer("limit", optional=True, lo=1))


@dataclass(slots=True)
class KbDelete:
    id: RequestId
    doc_id: str

    @classmethod
    def from_body(cls, body: Any) -> KbDelete:
        f = Fields(body)
        return cls(_id(f), _text(f, "doc_id", MAX_KB_REF_CHARS))  # type: ignore[arg-type]


@dataclass(slots=True)
class KbSearch:
    id: RequestId
    query: str
    limit: int = 5
    collection: str | None = None

    @classmethod
    def from_body(cls, body: Any) -> KbSearch:
        f = Fields(body)
        limit = f.integer("limit", optional=True, default=5, lo=1)
        if limit > MAX_KB_LIMIT:
            raise invalid("limit", f"expected an integer in 1..{MAX_KB_LIMIT}, got {limit}")
        return cls(_id(f), _text(f, "query", MAX_KB_QUERY_CHARS), limit,  # type: ignore[arg-type]
                   _text(f, "collection", MAX_KB_REF_CHARS, optional=True))


@dataclass(slots=True)
class KbPassage:
    id: RequestId
    chunk_id: str

    @classmethod
    def from_body(cls, body: Any) -> KbPassage:
        f = Fields(body)
        return cls(_id(f), _text(f, "chunk_id", MAX_KB_REF_CHARS))  # type: ignore[arg-type]


@dataclass(slots=True)
class KbDownload:
    """Stream a document from ``offset`` in KB_DOWNLOAD_DATA frames tagged ``handle`` (chosen by the
    client, unique among its downloads in progress); the RESPONSE follows the last frame."""
    id: RequestId
    doc_id: str
    handle: int
    offset: int = 0

    @classmethod
    def from_body(cls, body: Any) -> KbDownload:
        f = Fields(body)
        handle = f.integer("handle")
        if handle > 0xFFFFFFFF:
            raise invalid("handle", "expected an integer in 0..4294967295")
        return cls(_id(f), _text(f, "doc_id", MAX_KB_REF_CHARS), handle,  # type: ignore[arg-type]
                   f.integer("offset", optional=True, default=0))


KB_REQUEST_TYPES: dict[MsgType, type] = {
    MsgType.KB_UPLOAD_BEGIN: KbUploadBegin,
    MsgType.KB_UPLOAD_END: KbUploadEnd,
    MsgType.KB_LIST: KbList,
    MsgType.KB_DELETE: KbDelete,
    MsgType.KB_SEARCH: KbSearch,
    MsgType.KB_PASSAGE: KbPassage,
    MsgType.KB_DOWNLOAD: KbDownload,
}


# -- objects -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KbDocument(Wire):
    doc_id: str
    name: str
    md5: str
    sha256: str
    size: int
    chunks: int
    collection: str
    uploaded_at: str
    uploader: str
    duplicate: bool = False

    @classmethod
    def read(cls, f: Fields) -> KbDocument:
        return cls(f.text("doc_id"), f.text("name"), f.text("md5"), f.text("sha256"), f.integer("size"),
                   f.integer("chunks"), f.text("collection"), f.text("uploaded_at"), f.text("uploader"),
                   f.flag("duplicate", optional=True))

    def encode(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "name": self.name, "md5": self.md5, "sha256": self.sha256,
                "size": self.size, "chunks": self.chunks, "collection": self.collection,
                "uploaded_at": self.uploaded_at, "uploader": self.uploader, "duplicate": self.duplicate}


@dataclass(frozen=True, slots=True)
class KbHit(Wire):
    """A passage: its text, where it is (``location``: heading path, page, lines) and its citation."""
    doc_id: str
    name: str
    chunk_id: str
    text: str
    score: float
    location: dict[str, Any]
    collection: str
    citation: str

    @classmethod
    def read(cls, f: Fields) -> KbHit:
        return cls(f.text("doc_id"), f.text("name"), f.text("chunk_id"), f.text("text"),
                   f.number("score", optional=True, default=0), f.mapping("location", optional=True),
                   f.text("collection"), f.text("citation", optional=True, default=""))

    def encode(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "name": self.name, "chunk_id": self.chunk_id, "text": self.text,
                "score": self.score, "location": self.location, "collection": self.collection,
                "citation": self.citation}


# -- replies -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KbReply(Addressed):
    """Base of the knowledge-base replies."""


_kw = addressed


@dataclass(frozen=True, slots=True)
class KbUploadReply(KbReply):
    """KB_UPLOAD_BEGIN: send data frames tagged ``handle`` from ``offset`` (> 0: a resumed upload)."""
    upload_id: str
    handle: int
    offset: int
    size: int
    chunk_size: int
    expires_at: str

    @classmethod
    def read(cls, f: Fields) -> KbUploadReply:
        return cls(f.text("upload_id"), f.integer("handle"), f.integer("offset"), f.integer("size"),
                   f.integer("chunk_size", lo=1), f.text("expires_at"), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "upload_id": self.upload_id, "handle": self.handle,
                             "offset": self.offset, "size": self.size, "chunk_size": self.chunk_size,
                             "expires_at": self.expires_at})


@dataclass(frozen=True, slots=True)
class KbDocumentReply(KbReply):
    """KB_UPLOAD_END: the stored document (``duplicate: true`` when the bytes were already there)."""
    document: KbDocument

    @classmethod
    def read(cls, f: Fields) -> KbDocumentReply:
        return cls(f.obj("document", KbDocument.read), **_kw(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "document": self.document.encode()})


@dataclass(frozen=True, slots=True)
class KbListReply(KbReply):
    """KB_LIST: newest first; with ``has_more``, the next page is asked with ``before: next_before``."""
    documents: tuple[KbDocument, ...] = ()
    has_more: bool = False
    next_before: str | None = None

    @classmethod
    def read(cls, f: Fields) -> KbListReply:
        return cls(f.objects("documents", KbDocument.read), f.flag("has_more", optional=True),
                   f.text("next_before", optional=True), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "documents": [d.encode() for d in self.documents],
                             "has_more": self.has_more, "next_before": self.next_before})


@dataclass(frozen=True, slots=True)
class KbDeleteReply(KbReply):
    """``kept_for``: the group member the document stays with (another member who uploaded the same
    bytes, docs/knowledge.md "Duplicates"): the caller's upload is withdrawn, the document is not
    removed. Absent when it is removed."""
    doc_id: str
    kept_for: str | None = None

    @classmethod
    def read(cls, f: Fields) -> KbDeleteReply:
        return cls(f.text("doc_id"), f.text("kept_for", optional=True), **_kw(f))

    def encode(self) -> dict[str, Any]:
        out = {"re": self.re, "doc_id": self.doc_id, "deleted": True}
        if self.kept_for is not None:
            out["kept_for"] = self.kept_for
        return self._finish(out)


@dataclass(frozen=True, slots=True)
class KbSearchReply(KbReply):
    hits: tuple[KbHit, ...] = ()

    @classmethod
    def read(cls, f: Fields) -> KbSearchReply:
        return cls(f.objects("hits", KbHit.read), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "hits": [h.encode() for h in self.hits]})


@dataclass(frozen=True, slots=True)
class KbPassageReply(KbReply):
    passage: KbHit

    @classmethod
    def read(cls, f: Fields) -> KbPassageReply:
        return cls(f.obj("passage", KbHit.read), **_kw(f))  # type: ignore[arg-type]

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "passage": self.passage.encode()})


@dataclass(frozen=True, slots=True)
class KbDownloadReply(KbReply):
    """KB_DOWNLOAD, sent after the last data frame: ``length`` bytes were sent from ``offset``."""
    document: KbDocument
    offset: int
    length: int

    @classmethod
    def read(cls, f: Fields) -> KbDownloadReply:
        return cls(f.obj("document", KbDocument.read), f.integer("offset"), f.integer("length"),  # type: ignore[arg-type]
                   **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "document": self.document.encode(), "offset": self.offset,
                             "length": self.length})


KB_REPLY_TYPES: dict[MsgType, type[KbReply]] = {
    MsgType.KB_UPLOAD_BEGIN: KbUploadReply,
    MsgType.KB_UPLOAD_END: KbDocumentReply,
    MsgType.KB_LIST: KbListReply,
    MsgType.KB_DELETE: KbDeleteReply,
    MsgType.KB_SEARCH: KbSearchReply,
    MsgType.KB_PASSAGE: KbPassageReply,
    MsgType.KB_DOWNLOAD: KbDownloadReply,
}


# -- event ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KbProgress(KbReply):
    """An upload's progress, to the uploader only: ``stage`` (receiving: bytes; parsing 0/1, 1/1;
    chunking: blocks; indexing: chunks) and ``done`` of ``total``."""
    TYPE: ClassVar[MsgType] = MsgType.KB_PROGRESS
    upload_id: str
    stage: str
    done: int
    total: int

    @classmethod
    def read(cls, f: Fields) -> KbProgress:
        return cls(f.text("upload_id"), f.text("stage"), f.integer("done"), f.integer("total"), **_kw(f))

    def encode(self) -> dict[str, Any]:
        return self._finish({"re": self.re, "upload_id": self.upload_id, "stage": self.stage,
                             "done": self.done, "total": self.total})

"""The knowledge base: ingest (off the event loop, with progress), list, delete, search, passages
and downloads, every call checked against the caller's collections.

Isolation rule: a document outside the caller's readable collections is "not found" for every call
(list, search, get passage, download, delete), so ids of other users' documents leak nothing.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from typing import BinaryIO, Callable, Collection

from protocol import ErrorCode
from server.errors import HandlerError, not_found
from server.memory.embeddings import Embedder, EmbeddingError
from server.knowledge.access import can_read, readable, resolve
from server.knowledge.chunker import chunk_blocks
from server.knowledge.config import KnowledgeConfig
from server.knowledge.index import ChunkIndex, chunk_terms
from server.knowledge.models import DocumentInfo, Hit
from server.knowledge.names import clean_name
from server.knowledge.budget import Cancelled
from server.knowledge.parsers import kind_of, parse
from server.knowledge.port import DocumentStore, Loaded, Staged
from server.knowledge.store import FileDocumentStore, UploadersChange, Usage, write_json

log = logging.getLogger("nplt.knowledge")

Progress = Callable[[str, int, int], None]       # (stage, done, total), called on the event loop
STAGES = ("receiving", "parsing", "chunking", "indexing")
READ_BLOCK = 1 << 20
#: chunks a search looks at, at most, to fill its top k with distinct passages when copies of the
#: same text take places (``KnowledgeBase._distinct``); top k itself is at most 100
SEARCH_MAX_DEPTH = 400
#: while the stored documents are being loaded at start-up (``load_in_background``), a progress line
#: is logged at most this often (seconds), then one line when the load is done, with its time
LOAD_PROGRESS_S = 10.0
_CHUNK_NO = re.compile(r"[0-9]{1,9}")


class _LoadStopped(Exception):
    """The knowledge base closed while its documents were being loaded: the load stops there."""


def drain(items: list | None) -> None:
    """Empty ``items`` one element at a time (worker threads). Freeing a big list of dicts at once
    (``clear()``, or its last reference going) is one C call that holds the GIL throughout: the term
    bags of a document's chunks took 57 ms for 4,000 Chinese chunks, 229 ms for 16,000, every
    client's requests waiting. Element by element, the interpreter hands the GIL to the event loop
    between them (``sys.getswitchinterval``)."""
    if items:
        pop = items.pop
        while items:
            pop()


class KnowledgeBase:
    """The knowledge base over a document store (``server.knowledge.port``): files under ``root`` by
    default, or ``store``. Its catalog (``_docs``, ``_by_hash``) and ChunkIndex are an in-memory view
    of the store, kept current with other nodes' changes when the store is shared."""

    def __init__(self, config: KnowledgeConfig, root: str | os.PathLike | None,
                 embedder: Embedder | None = None, store: DocumentStore | None = None,
                 groups_of: Callable[[str], Collection[str]] | None = None) -> None:
        self.config = config
        # a user's groups now (``[auth] users``: ``Authenticator.groups_of``), asked when a group
        # document is handed over to a co-uploader: only one who can still read its collection takes
        # it. None: every co-uploader is taken to be a member still
        self.groups_of = groups_of
        if store is None:
            if root is None:
                raise ValueError("a KnowledgeBase needs a root directory or a store")
            store = FileDocumentStore(root)
        self.store = store
        if embedder is None and config.embeddings.enabled:
            embedder = Embedder(config.embeddings)
        self.embedder = embedder
        self.index = ChunkIndex(config.bm25_k1, config.bm25_b, config.title_weight)
        self._docs: dict[str, DocumentInfo] = {}
        self._by_hash: dict[tuple[str, str], str] = {}       # (collection, sha256) -> doc_id
        self.lock = threading.Lock()                         # index and the maps above
        self._uploaders_lock = asyncio.Lock()                # one change of uploaders at a time (_change_uploaders)
        self._pool = ThreadPoolExecutor(config.ingest_workers, thread_name_prefix="kb-ingest")
        self._user_ingests: dict[str, int] = {}                  # user -> ingests running or waiting
        self._user_slots: dict[str, asyncio.Semaphore] = {}      # user -> ingest threads they may hold
        self._slot_waiters: dict[str, list[asyncio.Future]] = {}  # user -> wait_for_ingest_slot callers
        self._stops: set[threading.Event] = set()                # the running ingests' cancel flags
        self._committing: dict[str, tuple[str, int]] = {}        # doc_id -> (uploader, chunks), of the commits in flight
        self._closing = False
        # the load of the stored documents: "idle" (not asked), "loading" (knowledge requests answer
        # SERVER_BUSY meanwhile), "ready", or "failed" (they answer STORAGE_ERROR: see the log)
        self.load_state = "idle"
        self._load_task: asyncio.Task | None = None
        self._load_error = ""
        self._loaded_docs = self._loaded_chunks = 0              # (counted by the load's thread)
        self._load_started = self._load_logged = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the store and load every document (``open``, then the load awaited: errors raised)."""
        await self.open()
        self.load_state = "loading"
        try:
            await self._load()
        except BaseException:
            self.load_state = "failed"
            raise

    async def open(self) -> None:
        """Open the store (clearing crash debris) and follow other nodes' changes when it is shared;
        the documents are not loaded yet (``start``, or ``load_in_background``)."""
        await self.store.open()
        await self.store.watch(self._on_change, self._resync)   # first: no change is missed while loading

    def load_in_background(self) -> asyncio.Task:
        """Load the stored documents in a task (after ``open``): the server listens meanwhile, and the
        knowledge requests answer SERVER_BUSY ("still loading") until it is done. A failed load is
        logged as an ERROR, and the knowledge requests answer STORAGE_ERROR from then on."""
        self.load_state = "loading"
        self._load_task = asyncio.get_running_loop().create_task(self._load_logged_errors())
        return self._load_task

    async def wait_loaded(self) -> None:
        """Until the background load (if any) has ended, whatever its outcome."""
        if self._load_task is not None:
            await asyncio.wait((self._load_task,))

    async def _load_logged_errors(self) -> None:
        try:
            await self._load()
        except _LoadStopped:
            self.load_state = "failed"
            self._load_error = "the server is stopping"
        except Exception as exc:
            self.load_state = "failed"
            self._load_error = f"{type(exc).__name__}: {exc}"
            log.error("knowledge base: the stored documents could not be loaded (%s); knowledge requests "
                      "answer STORAGE_ERROR until the server is restarted", self._load_error, exc_info=exc)

    async def _load(self) -> None:
        """Load every document into the index (off the event loop), logging its progress every
        ``LOAD_PROGRESS_S`` and its end; then follow other nodes' changes when the store is shared."""
        self._load_started = self._load_logged = time.monotonic()
        self._loaded_docs = self._loaded_chunks = 0
        log.info("knowledge base: loading the stored documents")
        await self.store.load(self._load_each)
        await asyncio.to_thread(self._compact)
        if self.store.shared:
            await self._resync()     # a document deleted while the load read it: dropped now
        self.load_state = "ready"
        log.info("knowledge base: loaded %d documents (%d chunks) in %.1f s", len(self._docs), len(self.index),
                 time.monotonic() - self._load_started)

    def _compact(self) -> None:
        with self.lock:
            self.index.compact()

    def _load_one(self, loaded: Loaded) -> None:
        """Worker thread: analyze one stored document and add it (unless it is there already)."""
        info, chunks, vectors = loaded
        terms = [chunk_terms(c["text"], c["location"].get("heading", ()), self.config.title_weight) for c in chunks]
        with self.lock:
            self.add(info, chunks, terms, vectors)
        drain(terms)

    def _load_each(self, loaded: Loaded) -> None:
        """Worker thread: one document of the start-up load (``_load_one``), counted, its progress
        logged every ``LOAD_PROGRESS_S``; the load stops here once the knowledge base is closing."""
        if self._closing:
            raise _LoadStopped()
        self._load_one(loaded)
        self._loaded_docs += 1
        self._loaded_chunks += len(loaded[1])
        now = time.monotonic()
        if now - self._load_logged >= LOAD_PROGRESS_S:
            self._load_logged = now
            log.info("knowledge base: loading: %d documents (%d chunks) so far, %.0f s", self._loaded_docs,
                     self._loaded_chunks, now - self._load_started)

    def _check_loaded(self) -> None:
        """SERVER_BUSY while the stored documents are being loaded (a search would miss documents,
        a list would be partial, an upload could not tell duplicates), STORAGE_ERROR if that failed."""
        state = self.load_state
        if state == "loading":
            raise HandlerError(ErrorCode.SERVER_BUSY, "the knowledge base is still loading its documents "
                               f"({self._loaded_docs} loaded so far, since the server started); retry in a moment")
        if state == "failed":
            raise HandlerError(ErrorCode.STORAGE_ERROR, "the knowledge base could not load its documents "
                               f"({self._load_error}); ask the server's administrator")

    async def close(self) -> None:
        """Cancel the running ingests (each stops at its next page / block, answering
        SHUTTING_DOWN), wait for the threads, close the store. Safe to call twice."""
        if self._closing:
            return
        self._closing = True
        for stop in list(self._stops):
            stop.set()
        for user in list(self._slot_waiters):      # (they answer SHUTTING_DOWN)
            self._wake(user)
        await self.wait_loaded()                   # (it stops at its next document)
        await self.store.close()
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        if self.embedder is not None:
            await self.embedder.aclose()

    # -- the catalog (server.knowledge.port.Catalog), with ``lock`` held ---------------------------
    def add(self, info: DocumentInfo, chunks: list[dict], terms: list[dict[str, float]],
            vectors: list[list[float]] | None) -> None:
        if info.doc_id in self._docs:            # (loaded already: a shared store's notification came first)
            return
        self._docs[info.doc_id] = info
        self._committing.pop(info.doc_id, None)      # (its chunks are in the index now)
        self._by_hash[(info.collection, info.sha256)] = info.doc_id
        self.index.add(info.doc_id, info.collection, chunks, terms, vectors)

    def duplicate_of(self, collection: str, sha256: str) -> DocumentInfo | None:
        dup = self._by_hash.get((collection, sha256))
        return self._docs[dup] if dup is not None else None

    def _drop(self, doc_id: str) -> None:
        with self.lock:
            info = self._docs.pop(doc_id, None)
            if info is None:
                return
            if self._by_hash.get((info.collection, info.sha256)) == doc_id:
                del self._by_hash[(info.collection, info.sha256)]
            self.index.remove(doc_id, info.chunks)

    # -- other nodes' changes (a shared store) -----------------------------------------------------
    async def _on_change(self, op: str, doc_id: str) -> None:
        if op == "del":
            await asyncio.to_thread(self._drop, doc_id)
        elif op == "upd":                    # (its uploader or co-uploaders changed, on any node)
            await self._reload_uploaders([doc_id])
        elif doc_id not in self._docs:
            loaded = await self.store.fetch(doc_id)
            if loaded is not None:
                await asyncio.to_thread(self._load_one, loaded)

    async def _resync(self) -> None:
        """After changes may have been missed: drop what is gone, read what is new."""
        ids = await self.store.doc_ids()
        for doc_id in [d for d in list(self._docs) if d not in ids]:
            await asyncio.to_thread(self._drop, doc_id)
        for doc_id in sorted(ids - set(self._docs)):
            await self._on_change("add", doc_id)
        await self._reload_uploaders(None)      # ("upd" notifications missed too)

    async def _reload_uploaders(self, doc_ids: list[str] | None) -> None:
        """Read the uploaders of ``doc_ids`` (None: every document) from a shared store into the
        catalog; under ``_uploaders_lock``, so a read never lands after this node's own newer change."""
        reader = getattr(self.store, "uploaders", None)
        if reader is None:
            return
        async with self._uploaders_lock:
            found = await reader(doc_ids)
            with self.lock:
                for doc_id, (uploader, co) in found.items():
                    self._set_uploaders(doc_id, uploader, co)

    # -- access ------------------------------------------------------------------------------------
    def _visible(self, user: str, groups: Collection[str], doc_id: str) -> DocumentInfo:
        self._check_loaded()
        info = self._docs.get(doc_id) if isinstance(doc_id, str) else None
        if info is None or not can_read(user, groups, info.collection):
            raise not_found("document")
        return info

    def usage(self, user: str) -> int:
        """Bytes of the documents ``user`` uploaded (counted against ``user_quota_bytes``); SERVER_BUSY
        while the documents are being loaded (an upload is refused at its start then)."""
        self._check_loaded()
        return sum(d.size for d in list(self._docs.values()) if d.uploader == user)

    def chunks_of(self, user: str) -> int:
        """Chunks of the documents ``user`` uploaded, every collection, those being committed included
        (counted against ``max_chunks_per_user``). With ``lock`` held."""
        held = sum(d.chunks for d in list(self._docs.values()) if d.uploader == user)
        return held + sum(n for who, n in list(self._committing.values()) if who == user)

    # -- ingestion ---------------------------------------------------------------------------------
    async def ingest(self, user: str, groups: Collection[str], collection: str | None, name: str,
                     data: bytes | str | os.PathLike, md5: str | None = None,
                     progress: Progress | None = None,
                     cancelled: Callable[[], bool] | None = None) -> DocumentInfo:
        """Store, parse, chunk and index one document into ``collection`` (None = personal).

        ``data`` is the bytes or a path to read. Errors (HandlerError): FORBIDDEN, INVALID_MESSAGE
        (file name), QUOTA_EXCEEDED (also: ``max_ingests_per_user`` of the user's ingests running or
        waiting), CHECKSUM_MISMATCH (``md5`` given and different), UNSUPPORTED_MEDIA, STORAGE_ERROR,
        SHUTTING_DOWN (the knowledge base is closing). Nothing is kept on error. The same bytes
        already in the collection return that document with ``duplicate=True``.

        Fairness: a user's ingests hold at most ``config.user_ingest_threads`` of the
        ``ingest_workers`` threads; the others wait here, holding no thread. Cancellation: when this
        coroutine is cancelled, ``cancelled()`` (optional, polled from the thread, e.g. "the client
        left") turns true, or the knowledge base closes, the thread stops at its next page / block.
        """
        coll = resolve(user, groups, collection)
        name = clean_name(name)
        kind_of(name)
        self._check_loaded()
        loop = asyncio.get_running_loop()

        loop_thread = threading.get_ident()

        def report(stage: str, done: int, total: int) -> None:
            if progress is None:
                return
            if threading.get_ident() == loop_thread:
                progress(stage, done, total)          # (after what the threads queued: already run)
            else:
                loop.call_soon_threadsafe(progress, stage, done, total)

        stop = threading.Event()

        def stopped() -> bool:
            return stop.is_set() or (cancelled is not None and bool(cancelled()))

        job = await self._start_job(user, stop, self._stage, user, coll, name, data, md5, report, stopped)
        try:
            staged = await asyncio.shield(job)
        except asyncio.CancelledError:          # the thread stops at its next check: remove what it staged
            stop.set()
            job.add_done_callback(self._discard_result)
            raise
        finally:
            # a failed job's exception has this frame in its traceback: holding ``job`` here would make
            # a cycle that only gc frees, keeping the stage's and the parser's frames (the file's bytes)
            del job
        if isinstance(staged, DocumentInfo):
            return await self._co_upload(user, staged)
        vectors = None
        try:
            vectors = await self._embed(staged, report)
            stored = await self._commit(user, coll, name, staged, vectors, report)
        except asyncio.CancelledError:          # (a commit thread may still read it: left as it is)
            self.store.staged.discard(staged.path)
            raise
        except BaseException:
            await asyncio.to_thread(self._release, staged, vectors, True)
            raise
        # the index holds what it needs (its own arrays, the texts): the rest is freed in a thread, in
        # pieces, not here on the event loop when ``staged`` goes (a stall of every client's requests)
        await asyncio.to_thread(self._release, staged, vectors, False)
        del staged, vectors
        return await self._co_upload(user, stored) if stored.duplicate else stored

    def _release(self, staged: Staged, vectors: list | None, discard: bool) -> None:
        """Worker thread: free a staged document's term bags, records and vectors piece by piece
        (``drain``), and remove its staging directory when ``discard``."""
        if discard:
            self.store.staged.discard(staged.path)
        drain(staged.terms)
        drain(staged.chunks)
        drain(vectors)

    # -- group documents several members uploaded ---------------------------------------------------
    def _set_uploaders(self, doc_id: str, uploader: str, co: tuple[str, ...]) -> None:
        """The catalog's record of a document's uploaders. With ``lock`` held."""
        info = self._docs.get(doc_id)
        if info is not None and (info.uploader, info.co_uploaders) != (uploader, tuple(co)):
            self._docs[doc_id] = replace(info, uploader=uploader, co_uploaders=tuple(co))

    def co_uploaders(self, doc_id: str) -> tuple[str, ...]:
        """The other members who uploaded the same bytes into a group document (in upload order)."""
        info = self._docs.get(doc_id)
        return info.co_uploaders if info is not None else ()

    async def _change_uploaders(self, doc_id: str, change: UploadersChange,
                                seen: DocumentInfo | None = None, *, with_usage: bool = False) -> DocumentInfo | None:
        """Apply ``change`` to a document's uploaders in the store (``update_uploaders``: on
        PostgreSQL under the row's lock, so other nodes' changes are kept) and in the catalog; the
        document as it is now (None: gone). ``seen``: the document as the store answered it, for
        one a shared store holds that this node has not loaded yet. A store without
        ``update_uploaders`` keeps nothing: the change is made in this node's memory if the store is
        not shared, not at all if it is. ``with_usage``: a shared store gives ``change`` what each
        co-uploader holds, read in the transaction of the change (``Usage``)."""
        async with self._uploaders_lock:
            info = self._docs.get(doc_id) or (seen if self.store.shared else None)
            if info is None:
                return None
            updater = getattr(self.store, "update_uploaders", None)
            if updater is not None:
                now = await updater(info, change, with_usage=with_usage)
            elif self.store.shared:
                return info
            else:
                new = change(info.uploader, info.co_uploaders, None)
                now = info if new is None else replace(info, uploader=new[0], co_uploaders=tuple(new[1]))
            with self.lock:
                if now is not None:
                    self._set_uploaders(doc_id, now.uploader, now.co_uploaders)
                    now = self._docs.get(doc_id, now)
            return now

    async def _co_upload(self, user: str, dup: DocumentInfo) -> DocumentInfo:
        """A duplicate upload: in a group collection, by a member other than its uploader, the member
        is recorded as a co-uploader (kept by the store), so the uploader's delete later keeps the
        document for them (``delete``) instead of removing what they were told was stored."""
        if not dup.collection.startswith("group:") or dup.uploader == user:
            return dup

        def join(uploader: str, co: tuple[str, ...], _usage: object) -> tuple[str, tuple[str, ...]] | None:
            return None if user == uploader or user in co else (uploader, (*co, user))
        await self._change_uploaders(dup.doc_id, join, seen=dup)
        return dup

    def _shutting_down(self) -> HandlerError:
        return HandlerError(ErrorCode.SHUTTING_DOWN, "the knowledge base is closing")

    async def _start_job(self, user: str, stop: threading.Event, fn: Callable, *args) -> asyncio.Future:
        """Run ``fn(*args)`` on an ingest thread once ``user`` has a free slot (at most
        ``max_ingests_per_user`` running or waiting, ``user_ingest_threads`` running). The slot is
        held until the thread's work ends, even when the caller is cancelled first."""
        if self._closing:
            raise self._shutting_down()
        cfg = self.config
        held = self._user_ingests.get(user, 0)
        if held >= cfg.max_ingests_per_user:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED, f"{held} of your documents are being ingested "
                               f"(limit max_ingests_per_user = {cfg.max_ingests_per_user}); try again when one ends")
        self._user_ingests[user] = held + 1
        slot = self._user_slots.get(user)
        if slot is None:
            slot = self._user_slots[user] = asyncio.Semaphore(cfg.user_ingest_threads)
        job = None
        try:
            await slot.acquire()
            try:
                if self._closing:
                    raise self._shutting_down()
                job = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
            except RuntimeError:                     # the pool is shut down
                raise self._shutting_down() from None
            finally:
                if job is None:
                    slot.release()
        finally:
            if job is None:
                self._leave(user)
        self._stops.add(stop)

        def done(_f: asyncio.Future) -> None:
            slot.release()
            self._stops.discard(stop)
            self._leave(user)
        job.add_done_callback(done)
        return job

    def ingests_in_progress(self, user: str) -> int:
        """``user``'s ingests running or waiting for a thread (at most ``max_ingests_per_user``)."""
        return self._user_ingests.get(user, 0)

    async def wait_for_ingest_slot(self, user: str, give_up: asyncio.Future | None = None) -> bool:
        """Wait until ``user`` has fewer than ``max_ingests_per_user`` ingests running or waiting: then
        True, and an ``ingest`` for ``user`` called right away (nothing awaited in between) is not
        refused for that limit. Meant for a caller that holds a complete file and serves one request
        at a time (a v2 upload); the wait holds no thread. False once ``give_up`` is done (its caller
        left); SHUTTING_DOWN when the knowledge base closes. Waiters are woken, in the order they came,
        whenever one of the user's ingests ends."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closing:
                raise self._shutting_down()
            if self._user_ingests.get(user, 0) < self.config.max_ingests_per_user:
                return True
            if give_up is not None and give_up.done():
                return False
            woken = loop.create_future()
            waiters = self._slot_waiters.setdefault(user, [])
            waiters.append(woken)
            try:
                await asyncio.wait((woken,) if give_up is None else (woken, give_up),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                if woken in waiters:
                    waiters.remove(woken)
                    if not waiters and self._slot_waiters.get(user) is waiters:
                        del self._slot_waiters[user]

    def _wake(self, user: str) -> None:
        """Wake the callers waiting for one of ``user``'s ingests to end (they check again, in order)."""
        for woken in self._slot_waiters.pop(user, ()):
            if not woken.done():
                woken.set_result(None)

    def _leave(self, user: str) -> None:
        n = self._user_ingests.get(user, 0) - 1
        if n > 0:
            self._user_ingests[user] = n
        else:                                   # no ingest of the user running or waiting: forget them
            self._user_ingests.pop(user, None)
            self._user_slots.pop(user, None)
        self._wake(user)

    def _discard_result(self, job: asyncio.Future) -> None:
        if not job.cancelled() and job.exception() is None and isinstance(job.result(), Staged):
            try:                                 # (off the loop: the directory and the term bags)
                asyncio.get_running_loop().run_in_executor(None, self._release, job.result(), None, True)
            except RuntimeError:                 # (no loop, or its executor is shut down)
                self._release(job.result(), None, True)

    def _check_upload(self, size: int) -> None:
        if size > self.config.max_upload_bytes:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED,
                               f"file of {size} bytes over the upload limit ({self.config.max_upload_bytes})")

    def check_quota(self, user: str, coll: str, size: int) -> None:
        """Checked once the bytes are known not to be a duplicate, and again at commit (SERVER_BUSY
        while the documents are being loaded): ``user_quota_bytes``, in a group collection the
        member's share ``max_documents_per_member``, then ``max_documents_per_collection``."""
        self._check_loaded()
        problem = self._quota_problem(user, coll, size, new_document=True)
        if problem is not None:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED, problem)

    def _quota_problem(self, user: str, coll: str, size: int, *, new_document: bool,
                       chunks: int | None = None, usage: Usage | None = None) -> str | None:
        """Why ``user`` may not hold one more document of ``size`` bytes (and ``chunks`` chunks, when
        given) in ``coll``, or None. ``new_document``: it adds a document to the collection (an upload);
        else it is there already (a hand-over), and only the user's own limits count. ``usage``: the
        user's (bytes, chunks, documents in ``coll``) as the store read them, instead of the catalog's."""
        cfg = self.config
        used = in_coll = mine = 0
        for d in list(self._docs.values()):
            if d.uploader == user:
                used += d.size
                if d.collection == coll:
                    mine += 1
            if d.collection == coll:
                in_coll += 1
        if usage is not None:
            used, held_chunks, mine = usage
        if used + size > cfg.user_quota_bytes:
            return f"quota of {cfg.user_quota_bytes} bytes reached ({used} used)"
        if chunks is not None:
            held = self.chunks_of(user) if usage is None else held_chunks
            limit = cfg.max_chunks_per_user
            if held + chunks > limit:
                return (f"your documents hold {held} chunks; {chunks} more would take you over the per-user "
                        f"limit (max_chunks_per_user = {limit})")
        share = cfg.documents_per_member
        if coll.startswith("group:") and mine + 1 > share:
            return (f"you uploaded {mine} of the {in_coll} documents of {coll}, a member's share "
                    f"(max_documents_per_member = {share}): delete one of yours first")
        if new_document and in_coll >= cfg.max_documents_per_collection:
            return (f"collection {coll} holds {in_coll} documents (max_documents_per_collection = "
                    f"{cfg.max_documents_per_collection}), {mine} of them yours")
        return None

    def check_total_chunks(self, chunks: int, user: str | None = None) -> None:
        """QUOTA_EXCEEDED when ``chunks`` more would take ``user``'s documents over
        ``max_chunks_per_user``, or the index (with the documents being committed) over
        ``max_total_chunks`` (server-wide). With ``lock`` held."""
        if user is not None:
            held, limit = self.chunks_of(user), self.config.max_chunks_per_user
            if held + chunks > limit:
                raise HandlerError(ErrorCode.QUOTA_EXCEEDED, f"your documents hold {held} chunks; this document's "
                                   f"{chunks} would take you over the per-user limit (max_chunks_per_user = {limit})")
        limit = self.config.max_total_chunks
        held = len(self.index) + sum(n for _, n in self._committing.values())
        if held + chunks > limit:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED, f"the knowledge base holds {held} chunks; this document's "
                               f"{chunks} would take it over the server's limit (max_total_chunks = {limit})")

    def _stage(self, user: str, coll: str, name: str, data: bytes | str | os.PathLike, md5: str | None,
               report: Progress, cancelled: Callable[[], bool]) -> Staged | DocumentInfo:
        """Worker thread: copy, hash, verify, parse, chunk and analyze into a staging directory.
        ``cancelled`` is polled between the steps, by the parser (every page / block) and every
        1% of the chunks analyzed: a cancelled ingest stops there (``Cancelled``) and keeps nothing.
        Peak memory: the bytes once (a path is copied block by block, then read back once), the
        parsed blocks until they are chunked, the records (written before the terms are made)."""
        if cancelled():                         # (cancelled while it waited for a thread)
            raise Cancelled()
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else os.stat(data).st_size
        self._check_upload(size)
        doc_id = secrets.token_hex(12)
        try:
            path = self.store.staged.new(doc_id)
        except OSError as exc:
            raise HandlerError(ErrorCode.STORAGE_ERROR, f"cannot stage the document: {exc.strerror}") from None
        try:
            h_md5, h_sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
            report("receiving", 0, size)
            with open(path / "original", "wb") as out:
                if isinstance(data, (bytes, bytearray, memoryview)):
                    view = memoryview(data)
                    for off in range(0, size, READ_BLOCK):
                        part = view[off:off + READ_BLOCK]
                        h_md5.update(part), h_sha.update(part), out.write(part)
                        report("receiving", min(off + READ_BLOCK, size), size)
                else:
                    copied = 0
                    with open(data, "rb") as src:
                        while part := src.read(READ_BLOCK):
                            copied += len(part)
                            if copied > self.config.max_upload_bytes:
                                raise HandlerError(ErrorCode.QUOTA_EXCEEDED, "file grew over the upload limit")
                            h_md5.update(part), h_sha.update(part), out.write(part)
                            report("receiving", copied, size)
                    size = copied
                out.flush()
                os.fsync(out.fileno())
            digest, sha = h_md5.hexdigest(), h_sha.hexdigest()
            if md5 is not None and md5.lower() != digest:
                raise HandlerError(ErrorCode.CHECKSUM_MISMATCH, f"md5 of the received bytes is {digest}, not {md5.lower()}")
            with self.lock:
                dup = self.duplicate_of(coll, sha)
                if dup is not None:
                    self.store.staged.discard(path)
                    return replace(dup, duplicate=True)
            self.check_quota(user, coll, size)
            if cancelled():
                raise Cancelled()
            report("parsing", 0, 1)
            if isinstance(data, bytes):
                raw = data
            elif isinstance(data, (bytearray, memoryview)):
                raw = bytes(data)
            else:                                    # read back the copy just written (one allocation)
                raw = (path / "original").read_bytes()
            blocks = parse(name, raw, self.config, cancelled)
            del raw
            report("parsing", 1, 1)
            report("chunking", 0, len(blocks))
            n_blocks = len(blocks)
            # a chunk holds at most chunk_target_chars of body text (headings go to its heading path,
            # not its text): that text alone may already make too many
            body = sum(len(b.text) for b in blocks if not b.is_heading)
            least = -(-body // self.config.chunk_target_chars)
            if least > self.config.max_chunks_per_document:
                raise HandlerError(ErrorCode.QUOTA_EXCEEDED, f"document makes at least {least} chunks "
                                   f"(limit {self.config.max_chunks_per_document})")
            chunks = chunk_blocks(blocks, self.config.chunk_target_chars, self.config.chunk_overlap_chars)
            del blocks
            if len(chunks) > self.config.max_chunks_per_document:
                raise HandlerError(ErrorCode.QUOTA_EXCEEDED, f"document makes {len(chunks)} chunks "
                                   f"(limit {self.config.max_chunks_per_document})")
            with self.lock:                          # (before the analysis: its terms are most of the memory)
                self.check_total_chunks(len(chunks), user)
            report("chunking", n_blocks, n_blocks)
            records = [{"text": c.text, "location": c.location()} for c in chunks]
            headings = [c.heading for c in chunks]
            del chunks
            if cancelled():
                raise Cancelled()
            write_json(path / "chunks.json", records)      # before the terms: its text is freed first
            terms = []
            step = max(1, len(records) // 100)
            for i, (rec, heading) in enumerate(zip(records, headings)):
                terms.append(chunk_terms(rec["text"], heading, self.config.title_weight))
                if i % step == 0:
                    if cancelled():
                        raise Cancelled()
                    report("indexing", i, len(records))
            return Staged(doc_id, path, digest, sha, size, records, terms)
        except HandlerError:
            self.store.staged.discard(path)
            raise
        except OSError as exc:
            self.store.staged.discard(path)
            raise HandlerError(ErrorCode.STORAGE_ERROR, f"cannot store the document: {exc.strerror or exc}") from None
        except BaseException:
            self.store.staged.discard(path)
            raise

    async def _embed(self, staged: Staged, report: Progress) -> list[list[float]] | None:
        if self.embedder is None:
            return None
        size = self.config.embeddings.batch_size
        texts = [" ".join(c["location"].get("heading", [])) + "\n" + c["text"] for c in staged.chunks]
        out: list[list[float]] = []
        try:
            for start in range(0, len(texts), size):
                out.extend(await self.embedder.embed(texts[start:start + size]))
                report("indexing", start, len(texts))
        except EmbeddingError as exc:
            log.warning("document embeddings unavailable (BM25 only): %s", exc)
            return None
        return out

    async def _commit(self, user: str, coll: str, name: str, staged: Staged,
                      vectors: list[list[float]] | None, report: Progress) -> DocumentInfo:
        """Keep the document in the store (which decides duplicates and quotas for good)."""
        info = DocumentInfo(staged.doc_id, name, staged.md5, staged.sha256, staged.size,
                            len(staged.chunks), coll, datetime.now(timezone.utc).isoformat(), user)
        with self.lock:               # checked again, the other commits in flight counted
            if self.duplicate_of(coll, staged.sha256) is None:   # (else the store answers the duplicate)
                self.check_total_chunks(len(staged.chunks), user)
                self._committing[staged.doc_id] = (user, len(staged.chunks))
        try:
            stored = await self.store.commit(staged, info, vectors, self)
        finally:
            with self.lock:
                self._committing.pop(staged.doc_id, None)
        report("indexing", len(staged.chunks), len(staged.chunks))
        return stored

    # -- reading -----------------------------------------------------------------------------------
    async def list(self, user: str, groups: Collection[str], collection: str | None = None) -> list[DocumentInfo]:
        """Documents of ``collection`` (default: every readable collection, and the caller's own
        uploads wherever they are: those of a group they left count toward their quota, and they may
        delete them), newest first. SERVER_BUSY while the documents are being loaded."""
        self._check_loaded()
        if collection:
            coll = resolve(user, groups, collection)
            docs = [d for d in list(self._docs.values()) if d.collection == coll]
        else:
            member_of = frozenset(groups)
            docs = [d for d in list(self._docs.values())
                    if d.uploader == user or user in d.co_uploaders or can_read(user, member_of, d.collection)]
        return sorted(docs, key=lambda d: d.uploaded_at, reverse=True)

    async def get(self, user: str, groups: Collection[str], doc_id: str) -> DocumentInfo:
        return self._visible(user, groups, doc_id)

    async def delete(self, user: str, groups: Collection[str], doc_id: str, *,
                     admin: bool = False, passed_over: list[tuple[str, str]] | None = None) -> DocumentInfo | None:
        """Remove a document: its uploader, wherever it is (also in a group they have left, or one
        renamed or removed from the configuration: it counts toward their quota), or an admin who can
        read it. FORBIDDEN for another reader; NOT_FOUND if unseen. None when it is removed.

        A group document other members uploaded too (the same bytes: ``co_uploaders``) is not removed
        by its uploader's delete: it passes to the first co-uploader, in upload order, who can still
        read its collection (``groups_of``) and has room for it within their own limits
        (``user_quota_bytes``, ``max_chunks_per_user``, ``max_documents_per_member``): their quota
        from then on; the document, with its new ``uploader``, is returned. With no such co-uploader
        it is removed (None). The co-uploaders passed over are appended to ``passed_over`` (when
        given) with the reason. A co-uploader's delete withdraws their upload only (the document,
        unchanged, is returned), also from a collection they can no longer read (an admin too). An
        admin's delete of a document that is not theirs, in a collection they read, removes it for
        everyone."""
        self._check_loaded()
        info = self._docs.get(doc_id) if isinstance(doc_id, str) else None
        if info is not None and info.collection.startswith("group:") and (
                (info.uploader == user and (info.co_uploaders or self.store.shared))
                or (user in info.co_uploaders and not (admin and can_read(user, groups, info.collection)))):
            kept = await self._give_up(info, user, passed_over)
            if kept is not None:
                return kept
            info = self._docs.get(doc_id)     # (nobody else takes it, as the store says: removed below)
        if info is None or info.uploader != user:
            info = self._visible(user, groups, doc_id)
            if not admin:
                raise HandlerError(ErrorCode.FORBIDDEN, "only the uploader or an admin may delete a document")
        await self.store.remove(info)
        await asyncio.to_thread(self._drop, doc_id)
        return None

    def _why_not_taker(self, member: str, info: DocumentInfo, usage: Usage | None = None) -> str | None:
        """Why ``member`` (a co-uploader) cannot take over ``info`` from its uploader, or None: they can
        no longer read its collection, or it would take them over one of their limits. ``usage``: what
        they hold as a shared store read it in the hand-over's transaction (else the catalog's count)."""
        if self.groups_of is not None and not can_read(member, frozenset(self.groups_of(member)), info.collection):
            return f"no longer in {info.collection}"
        problem = self._quota_problem(member, info.collection, info.size, new_document=False, chunks=info.chunks,
                                      usage=usage)
        return None if problem is None else f"no room: {problem}"

    async def _give_up(self, info: DocumentInfo, user: str,
                       passed_over: list[tuple[str, str]] | None = None) -> DocumentInfo | None:
        """``user`` gives up a group document others uploaded too: its uploader's delete passes it
        to the first co-uploader who can take it (``_why_not_taker``), a co-uploader's delete
        withdraws their upload. The document kept for the others, or None when nobody else holds
        it or can take it (as the store says: on PostgreSQL another node may have changed them) and
        it is to be removed."""
        passed: list[tuple[str, str]] = []

        def leave(uploader: str, co: tuple[str, ...],
                  usage: dict[str, Usage] | None) -> tuple[str, tuple[str, ...]] | None:
            passed.clear()                   # (a store may call it again, with the uploaders as they are then)
            if uploader == user:
                for i, member in enumerate(co):
                    why = self._why_not_taker(member, info, None if usage is None else usage.get(member))
                    if why is None:
                        return member, co[:i] + co[i + 1:]
                    passed.append((member, why))
                return None                  # nobody can take it: left as it is, and removed
            return (uploader, tuple(u for u in co if u != user)) if user in co else None
        now = await self._change_uploaders(info.doc_id, leave, with_usage=True)
        if passed_over is not None:
            passed_over.extend(passed)
        if passed:
            log.info("document %s (%s) of %s: %s deleted it; co-uploaders passed over: %s", info.doc_id, info.name,
                     info.collection, user, "; ".join(f"{m} ({why})" for m, why in passed))
        if now is None or (now.uploader == user and not now.co_uploaders):
            return None
        if now.uploader == user or user in now.co_uploaders:    # (nobody could take it, or a store that keeps nothing)
            if passed:
                log.info("document %s (%s) of %s removed: no co-uploader can take it", info.doc_id, info.name,
                         info.collection)
            return None
        if info.uploader == user:
            log.info("document %s (%s) of %s: %s deleted it; kept for %s, who uploaded the same bytes",
                     info.doc_id, info.name, info.collection, user, now.uploader)
        return now

    async def search(self, user: str, groups: Collection[str], query: str, top_k: int = 5,
                     collection: str | None = None) -> list[Hit]:
        """The best ``top_k`` passages of the readable collections (or of ``collection``); SERVER_BUSY
        while the documents are being loaded."""
        self._check_loaded()
        visible = readable(user, groups)          # (built here, not under the lock: one name per group)
        colls = [resolve(user, groups, collection)] if collection else visible
        top_k = max(1, min(int(top_k), 100))
        if not query.strip():
            return []
        qvec = None
        if self.embedder is not None and self.index.has_vectors:
            try:
                [qvec] = await self.embedder.embed([query])
            except EmbeddingError as exc:
                log.warning("query embedding unavailable (BM25 only): %s", exc)

        def run() -> list[Hit]:
            with self.lock:
                return [self._hit(key, score) for key, score in
                        self._distinct(query, colls, top_k, qvec, visible)]
        return await asyncio.to_thread(run)

    def _distinct(self, query: str, colls: list[str], top_k: int, qvec: list[float] | None,
                  visible: list[str]) -> list[tuple[tuple[str, int], float]]:
        """The best ``top_k`` chunks, one document per identical text: copies of a file under other
        names (or in other readable collections) give the same passages, and only the best ranked
        copy's is kept (a passage repeated within one document is not a copy: kept), the rest filled
        from further down (searching deeper, up to ``SEARCH_MAX_DEPTH`` chunks). A
        result without such copies is the index's top ``top_k`` unchanged. With ``lock`` held."""
        depth = top_k
        while True:
            found = self.index.search(query, colls, depth, qvec, visible=visible)
            kept: list[tuple[tuple[str, int], float]] = []
            seen: dict[str, str] = {}            # text -> the document of the passage kept for it
            for key, score in found:
                text = self.index.chunks[key].text
                if seen.setdefault(text, key[0]) == key[0]:     # (one document repeating itself: kept)
                    kept.append((key, score))
            if len(kept) >= top_k or len(found) < depth or depth >= SEARCH_MAX_DEPTH:
                return kept[:top_k]
            depth = min(depth * 4, SEARCH_MAX_DEPTH)

    def _hit(self, key: tuple[str, int], score: float) -> Hit:
        ch = self.index.chunks[key]
        info = self._docs[key[0]]
        return Hit(key[0], info.name, f"{key[0]}:{key[1]}", ch.text, round(score, 6), ch.location, ch.collection)

    async def get_passage(self, user: str, groups: Collection[str], chunk_id: str) -> Hit:
        """One chunk by its id ("<doc_id>:<n>") with its location."""
        doc_id, _, n = str(chunk_id).partition(":")
        info = self._visible(user, groups, doc_id)
        if not _CHUNK_NO.fullmatch(n) or int(n) >= info.chunks:      # ASCII digits only ('²'.isdigit())
            raise not_found("passage")
        with self.lock:
            if (doc_id, int(n)) not in self.index.chunks:
                raise not_found("passage")
            return self._hit((doc_id, int(n)), 0.0)

    async def open_document(self, user: str, groups: Collection[str], doc_id: str,
                            offset: int = 0) -> tuple[DocumentInfo, BinaryIO]:
        """The stored bytes from ``offset`` (a resumed download), as an open binary file; read it off
        the loop and close it. INVALID_MESSAGE for an offset outside 0..size."""
        info = self._visible(user, groups, doc_id)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= info.size:
            raise HandlerError(ErrorCode.INVALID_MESSAGE, f"offset must be in 0..{info.size}")
        return info, await self.store.open_original(info, offset)

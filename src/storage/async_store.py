"""AsyncHistoryStore: the HistoryStore API as coroutines, each call run in a worker thread.

Safe to call inline on the event loop (no file I/O): ``validate_session_id``, ``new_session_id``,
``StorageConfig.from_dict``, ``AsyncHistoryStore.sync.list`` (reads the in-memory index only) and
``AsyncHistoryStore.sync.loaded_count``. Everything else may read or fsync files: await it here.
"""
from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from .config import StorageConfig
from .errors import StorageClosed
from .models import ChatMessage, EncodedPage, Page, SearchHit, SessionRecord, SummaryRecord, ToolCall
from .store import HistoryStore

T = TypeVar("T")


class AsyncHistoryStore:
    """Async facade over a HistoryStore (``.sync``) with its own thread pool (``io_threads``).

    ``append`` and ``update`` give their worker thread back as soon as the journal line is written
    and await the group commit's fsync on the loop, so far more than ``io_threads`` appends can
    share one flush. On a loaded, idle session they take no worker thread at all: the change is
    applied in memory on the loop and its journal line written by the flusher thread."""

    def __init__(self, store: HistoryStore | StorageConfig) -> None:
        self.sync = store if isinstance(store, HistoryStore) else HistoryStore(store)
        self._pool = ThreadPoolExecutor(self.sync.config.io_threads, thread_name_prefix="storage-io")
        self._handoff: _Handoff | None = None

    @classmethod
    async def open(cls, config: StorageConfig) -> AsyncHistoryStore:
        """Open the store (startup recovery reads files) without blocking the loop."""
        return cls(await asyncio.to_thread(HistoryStore, config))

    def _to_loop(self, fut: Future[T], *, cancel: bool = False) -> asyncio.Future[T]:
        """``fut`` (a worker job, or a commit's durability) awaitable on the running loop."""
        loop = asyncio.get_running_loop()
        handoff = self._handoff
        if handoff is None or handoff.loop is not loop:
            handoff = self._handoff = _Handoff(loop)
        return handoff.watch(fut, cancel=cancel)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            job = self._pool.submit(functools.partial(fn, *args, **kwargs))
        except RuntimeError:   # the pool is shut down: close() has run
            raise StorageClosed("the history store is closed") from None
        return await self._to_loop(job, cancel=True)

    async def create(self, user_id: str, title: str | None = None, model: str | None = None) -> SessionRecord:
        record, done = await self._run(self.sync.create_pending, user_id, title, model)
        await self._to_loop(done)
        return record

    def get_loaded(self, session_id: str) -> SessionRecord | None:
        """``HistoryStore.get_loaded``: the record if it is in memory and idle right now, else None
        (then await ``get``). No I/O, no waiting: safe on the event loop."""
        return self.sync.get_loaded(session_id)

    async def get(self, session_id: str) -> SessionRecord:
        record = self.sync.get_loaded(session_id)       # loaded and not busy: no thread hop
        return record if record is not None else await self._run(self.sync.get, session_id)

    async def records(self, session_ids: Iterable[str]) -> dict[str, SessionRecord]:
        return self.sync.records(session_ids)           # the index, in memory: no thread hop

    async def list(self, user_id: str, *, before: str | None = None, limit: int = 50,
                   deleted: bool = False) -> tuple[list[SessionRecord], str | None]:
        return await self._run(self.sync.list, user_id, before=before, limit=limit, deleted=deleted)

    async def rename(self, session_id: str, title: str, *, auto: bool = False) -> SessionRecord:
        return await self._run(self.sync.rename, session_id, title, auto=auto)

    async def set_model(self, session_id: str, model: str | None) -> SessionRecord:
        return await self._run(self.sync.set_model, session_id, model)

    async def delete(self, session_id: str) -> SessionRecord:
        return await self._run(self.sync.delete, session_id)

    async def restore(self, session_id: str) -> SessionRecord:
        return await self._run(self.sync.restore, session_id)

    async def undelete(self, session_id: str) -> SessionRecord:
        return await self._run(self.sync.undelete, session_id)

    async def purge(self, session_id: str) -> None:
        return await self._run(self.sync.purge, session_id)

    async def clear(self, session_id: str, *, purge: bool = False) -> int:
        return await self._run(self.sync.clear, session_id, purge=purge)

    async def set_system_prompt(self, session_id: str, prompt: str | None) -> SessionRecord:
        return await self._run(self.sync.set_system_prompt, session_id, prompt)

    async def append(self, session_id: str, role: str, content: str, *, tool_calls: Iterable[ToolCall | dict] = (),
                     metadata: dict[str, Any] | None = None, timestamp: str | None = None,
                     fence: int | None = None) -> ChatMessage:
        """``fence`` (the port's: store only if the session is as the answering turn left it) is
        ignored: one node, whose turns of a session run one at a time and which stops a session's
        turn before it clears or deletes the session."""
        calls = list(tool_calls)
        queued = self.sync.append_loaded(session_id, role, content, tool_calls=calls,
                                         metadata=metadata, timestamp=timestamp)   # loaded and idle: no thread hop
        if queued is not None:
            msg, done = queued
        else:
            msg, done = await self._run(self.sync.append_pending, session_id, role, content,
                                        tool_calls=calls, metadata=metadata, timestamp=timestamp)
        if done is not None:
            await self._to_loop(done)
        return msg

    async def update(self, session_id: str, message: ChatMessage) -> ChatMessage:
        queued = self.sync.update_loaded(session_id, message)      # loaded and idle: no thread hop
        msg, done = queued if queued is not None else await self._run(self.sync.update_pending, session_id, message)
        if done is not None:
            await self._to_loop(done)
        return msg

    async def page(self, session_id: str, before: int | None = None, limit: int = 50) -> Page:
        return await self._run(self.sync.page, session_id, before, limit)

    def page_encoded_loaded(self, session_id: str, before: int | None = None,
                            limit: int = 50) -> EncodedPage | None:
        """``HistoryStore.page_encoded_loaded``: the page if the session is in memory and idle right
        now, else None (then await ``page_encoded``). No I/O, no waiting: safe on the event loop."""
        return self.sync.page_encoded_loaded(session_id, before, limit)

    async def page_encoded(self, session_id: str, before: int | None = None, limit: int = 50) -> EncodedPage:
        page = self.sync.page_encoded_loaded(session_id, before, limit)   # loaded and idle: no thread hop
        return page if page is not None else await self._run(self.sync.page_encoded, session_id, before, limit)

    async def messages(self, session_id: str, *, after_id: int = 0) -> list[ChatMessage]:
        return await self._run(self.sync.messages, session_id, after_id=after_id)

    async def search(self, user_id: str, query: str, *, session_id: str | None = None,
                     limit: int = 20) -> list[SearchHit]:
        return await self._run(self.sync.search, user_id, query, session_id=session_id, limit=limit)

    async def export(self, session_id: str, fmt: str, model: str | None = None, *,
                     max_bytes: int | None = None) -> str:
        return await self._run(self.sync.export, session_id, fmt, model, max_bytes=max_bytes)

    async def add_summary(self, session_id: str, summary: SummaryRecord) -> SessionRecord:
        return await self._run(self.sync.add_summary, session_id, summary)

    async def compact(self, session_id: str) -> bool:
        return await self._run(self.sync.compact, session_id)

    async def close(self) -> None:
        """Close the store (compacts journals) in a thread, then stop the pool. Closing twice is a no-op."""
        try:
            await self._run(self.sync.close)
        except StorageClosed:
            return
        finally:
            self._pool.shutdown(wait=False)


class _Handoff:
    """Results of worker-thread futures handed to the event loop: one loop wake-up
    (``call_soon_threadsafe``) for every future that finishes before the loop gets to them, as the
    appends of one group-commit round do, instead of one each (``asyncio.wrap_future``).
    With ``cancel``, cancelling the loop-side future cancels a worker job that has not started; a
    commit's durability future is never cancelled (the flusher resolves it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Future[Any]]] = []

    def watch(self, fut: Future[T], *, cancel: bool) -> asyncio.Future[T]:
        out: asyncio.Future[T] = self.loop.create_future()
        if cancel:
            out.add_done_callback(lambda f: fut.cancel() if f.cancelled() else None)
        fut.add_done_callback(lambda f: self._done(out, f))
        return out

    def _done(self, out: asyncio.Future[Any], fut: Future[Any]) -> None:
        with self._lock:
            self._ready.append((out, fut))
            if len(self._ready) > 1:
                return                    # a wake-up is already on its way
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:              # the loop is closed: nobody is waiting any more
            pass

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for out, fut in ready:
            if out.done():
                continue
            if fut.cancelled():
                out.cancel()
            elif (exc := fut.exception()) is not None:
                out.set_exception(exc)
            else:
                out.set_result(fut.result())

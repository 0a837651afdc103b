"""The copy of the v3 uploads in progress that every node reads (several nodes on PostgreSQL).

A node shares the bytes it writes of an upload (``SharedParts``, ``storage.pg.upload_parts``): a
piece every ``upload_share_bytes``, and what is left when the connection goes away. A BEGIN on a
node that holds less of the upload than the shared copy first takes the rest (``missing``), and a
node that holds more shares it (``share_local``), so the client resumes through any node from what
was shared. The copy goes with the partial files (the upload ends, or expires). A failure to share
is logged and stops sharing that upload on this node: the upload itself goes on, and a resume
elsewhere starts from what was shared. ``up`` is a ``knowledge_uploads.Upload``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from server.knowledge.config import KnowledgeConfig

log = logging.getLogger("nplt.knowledge")


class SharedParts(Protocol):
    """Pieces of the uploads in progress, by offset, that every node reads."""
    async def put(self, upload_id: str, offset: int, data: bytes) -> None: ...
    async def extent(self, upload_id: str) -> int: ...
    async def read(self, upload_id: str, offset: int) -> bytes: ...
    async def drop(self, upload_id: str) -> None: ...
    async def expire(self, idle_s: float) -> int: ...


class UploadSharing:
    def __init__(self, config: KnowledgeConfig, parts: SharedParts) -> None:
        self.config = config
        self.parts = parts
        self._tasks: set[asyncio.Task] = set()       # the last pieces of uploads whose connection went

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _call(self, call: Any, what: str) -> Any:
        try:
            return await call
        except Exception as exc:                     # (StorageError: PostgreSQL unreachable; uploads go on)
            log.warning("uploads: cannot %s in the shared copy: %s", what, exc)
            return None

    async def expire(self) -> None:
        await self._call(self.parts.expire(self.config.upload_expiry_s), "expire old uploads")

    async def drop(self, upload_id: str) -> None:
        await self._call(self.parts.drop(upload_id), "drop an upload")

    async def missing(self, up: Any, held: int) -> bytes:
        """Before a (re)start on this node, which holds the first ``held`` bytes: what the shared copy
        holds after them (``up.shared``: the shared copy's extent)."""
        up.shared = min(await self._call(self.parts.extent(up.upload_id), "read an upload") or 0, up.size)
        if up.shared <= held:
            return b""
        more = await self._call(self.parts.read(up.upload_id, held), "read an upload") or b""
        return more[:up.size - held]

    async def share_local(self, up: Any) -> None:
        """After a (re)start: share what this node holds beyond the shared copy."""
        if up.written > up.shared:
            tail = await asyncio.to_thread(_read, up.part, up.shared, up.written)
            await self._put(up, up.shared, tail)

    async def written(self, up: Any, parts: list[memoryview]) -> None:
        """The writer wrote ``parts`` (the last bytes, ending at ``up.written``): share whole pieces."""
        if not up.share_failed:
            up.unshared += parts
            await self._share_pending(up, last=False)

    def detached(self, up: Any, writer: asyncio.Task | None) -> None:
        """The connection went: once ``writer`` is done, share the rest (for a resume elsewhere)."""
        if up.share_failed:
            return
        task = asyncio.get_running_loop().create_task(self._share_rest(up, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _share_rest(self, up: Any, writer: asyncio.Task | None) -> None:
        if writer is not None:
            await asyncio.wait([writer])
        await self._share_pending(up, last=True)

    async def _share_pending(self, up: Any, *, last: bool) -> None:
        if up.unshared and (last or sum(map(len, up.unshared)) >= self.config.upload_share_bytes):
            piece, up.unshared = b"".join(up.unshared), []
            await self._put(up, up.written - len(piece), piece)

    async def _put(self, up: Any, offset: int, data: bytes) -> None:
        if up.share_failed or not data:
            return
        try:
            await self.parts.put(up.upload_id, offset, data)
        except Exception as exc:
            up.share_failed, up.unshared = True, []
            log.warning("upload %s: cannot share its bytes (%s); a resume through another node starts "
                        "from byte %d", up.upload_id, exc, up.shared)
            return
        if offset <= up.shared:
            up.shared = max(up.shared, offset + len(data))


def _read(path: Any, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)

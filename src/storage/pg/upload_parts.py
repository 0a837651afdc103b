"""The shared copy of the v3 uploads in progress (migrations/0009_upload_parts.sql): the SQL only.

A node puts the bytes it has received of an upload as pieces keyed by their offset; another node
that the client resumes through reads the pieces that follow what it holds itself. Pieces of one
upload hold the same file's bytes at the same offsets (the upload id covers the file's md5), so a
piece put twice, or by two nodes, is harmless: the longer one is kept.
"""
from __future__ import annotations

from .link import PgLink


class PgUploadParts:
    def __init__(self, link: PgLink) -> None:
        self.link = link

    async def put(self, upload_id: str, offset: int, data: bytes) -> None:
        await self.link.run(lambda con: con.execute(
            "INSERT INTO nplt_upload_parts (upload_id, start_at, data) VALUES ($1, $2, $3) "
            "ON CONFLICT (upload_id, start_at) DO UPDATE SET touched_at = now(), data = CASE "
            "WHEN length(EXCLUDED.data) > length(nplt_upload_parts.data) THEN EXCLUDED.data "
            "ELSE nplt_upload_parts.data END", upload_id, offset, data), write=True)

    async def extent(self, upload_id: str) -> int:
        """How many bytes from the start of the file the pieces hold without a gap."""
        rows = await self.link.run(lambda con: con.fetch(
            "SELECT start_at, length(data) AS n FROM nplt_upload_parts WHERE upload_id = $1 ORDER BY start_at",
            upload_id), write=False)
        at = 0
        for row in rows:
            if row["start_at"] > at:
                break
            at = max(at, row["start_at"] + row["n"])
        return at

    async def read(self, upload_id: str, offset: int) -> bytes:
        """The bytes from ``offset`` on that the pieces hold without a gap (b"" when none)."""
        rows = await self.link.run(lambda con: con.fetch(
            "SELECT start_at, data FROM nplt_upload_parts WHERE upload_id = $1 "
            "AND start_at + length(data) > $2 ORDER BY start_at", upload_id, offset), write=False)
        out, at = [], offset
        for row in rows:
            start, data = row["start_at"], row["data"]
            if start > at:
                break                                  # a gap: what follows cannot be used
            if start + len(data) > at:
                out.append(data[at - start:])
                at = start + len(data)
        return b"".join(out)

    async def drop(self, upload_id: str) -> None:
        await self.link.run(lambda con: con.execute(
            "DELETE FROM nplt_upload_parts WHERE upload_id = $1", upload_id), write=True)

    async def expire(self, idle_s: float) -> int:
        """Remove the uploads whose last piece is older than ``idle_s`` seconds; the pieces removed."""
        status = await self.link.run(lambda con: con.execute(
            "DELETE FROM nplt_upload_parts WHERE upload_id IN (SELECT upload_id FROM nplt_upload_parts "
            "GROUP BY upload_id HAVING max(touched_at) < now() - make_interval(secs => $1))", float(idle_s)),
            write=True)
        return int(status.split()[-1])

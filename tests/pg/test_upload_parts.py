"""The shared copy of the uploads in progress (storage.pg.upload_parts) on a real PostgreSQL: pieces
by offset, the longer of two pieces at one offset kept, reads that stop at a gap, expiry."""
from __future__ import annotations

import pytest

from storage import StorageConfig
from storage.pg.upload_parts import PgUploadParts
from storage.port import open_store


@pytest.fixture
async def parts(pg_url):
    store = await open_store(StorageConfig(url=pg_url))
    try:
        yield PgUploadParts(store.link)
    finally:
        await store.close()


async def test_pieces_make_the_bytes_without_a_gap(parts):
    data = bytes(range(256)) * 40
    assert await parts.extent("up_a") == 0 and await parts.read("up_a", 0) == b""
    await parts.put("up_a", 0, data[:1000])
    await parts.put("up_a", 1000, data[1000:1500])
    await parts.put("up_a", 3000, data[3000:4000])                 # after a gap
    assert await parts.extent("up_a") == 1500
    assert await parts.read("up_a", 0) == data[:1500]
    assert await parts.read("up_a", 700) == data[700:1500]          # from inside a piece
    assert await parts.read("up_a", 1500) == b""                    # the gap: nothing usable
    await parts.put("up_a", 1000, data[1000:1200])                  # shorter at the same offset: kept longer
    await parts.put("up_a", 1200, data[1200:3000])                  # the gap filled, overlapping
    assert await parts.extent("up_a") == 4000 and await parts.read("up_a", 0) == data[:4000]
    await parts.put("up_a", 0, data[:2500])                         # longer at the same offset: replaces
    assert await parts.read("up_a", 0) == data[:4000]
    assert await parts.extent("up_b") == 0                          # uploads are apart
    await parts.drop("up_a")
    assert await parts.extent("up_a") == 0


async def test_expire_removes_only_uploads_idle_for_longer(parts):
    await parts.put("up_old", 0, b"x" * 10)
    await parts.put("up_new", 0, b"y" * 10)
    await parts.link.run(lambda con: con.execute(
        "UPDATE nplt_upload_parts SET touched_at = now() - interval '2 hours' WHERE upload_id = 'up_old'"),
        write=True)
    assert await parts.expire(3600) == 1
    assert await parts.extent("up_old") == 0 and await parts.extent("up_new") == 10

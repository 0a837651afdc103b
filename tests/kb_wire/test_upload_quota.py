"""Abandoned partial uploads (BEGIN, every byte, disconnect without END) count toward the uploader's
``max_uploads_per_user`` and ``user_quota_bytes``, over real TCP: a new BEGIN drops the user's oldest
detached partial to make room, a live upload is never dropped (QUOTA_EXCEEDED instead), a resume
still continues from its offset, and a restarted server counts the partial files it finds."""
from __future__ import annotations

import os

import pytest

from protocol import MsgType
from testkit.server import ReplyError, poll

from kb_wire.kbwire import connect, kb_server, md5, send_data

SIZE = 4000


def text(i: int) -> bytes:
    line = f"partial upload {i}: the relay on port {7000 + i} restarts nightly.\n".encode()
    return (line * (SIZE // len(line) + 1))[:SIZE]


def partials(srv) -> dict[str, int]:
    """upload_id -> size of every partial file in the uploads directory."""
    root = srv.services.uploads.root
    return {p.stem: p.stat().st_size for p in root.glob("*.part")} if root.exists() else {}


async def abandon(srv, addr, user: str, name: str, data: bytes) -> str:
    """BEGIN, every byte written, then the connection goes without KB_UPLOAD_END; the upload id."""
    c = await connect(addr, user)
    begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=md5(data))
    send_data(c, begin["handle"], begin["offset"], data[begin["offset"]:])
    await c.wait_for(lambda m: m.type == MsgType.KB_PROGRESS and m.body["done"] == len(data))
    await c.close()
    await poll(lambda: srv.services.uploads.in_progress() == 0, what="the server saw the disconnect")
    return begin["upload_id"]


async def test_abandoned_uploads_are_bounded_by_the_quota_and_the_limit_then_resume(tmp_path):
    knowledge = {"user_quota_bytes": 10_000, "max_uploads_per_user": 4}
    async with kb_server(tmp_path, knowledge) as (srv, addr):
        ids = [await abandon(srv, addr, "bob", f"part{i}.txt", text(i)) for i in range(6)]
        held = partials(srv)
        # 10,000 bytes of quota hold two 4,000-byte partials: the oldest were dropped to make room
        assert set(held) == set(ids[-2:]) and sum(held.values()) <= 10_000
        assert srv.services.uploads.reserved("bob") == (2, 2 * SIZE)
        # another user is not affected by bob's partials
        await abandon(srv, addr, "alice", "a.txt", text(9))
        assert len(partials(srv)) == 3
        # the newest partial resumes at its end and is stored
        c = await connect(addr, "bob")
        again = await c.call(MsgType.KB_UPLOAD_BEGIN, name="part5.txt", size=SIZE, md5=md5(text(5)))
        assert again["upload_id"] == ids[5] and again["offset"] == SIZE
        doc = (await c.call(MsgType.KB_UPLOAD_END, upload_id=again["upload_id"]))["document"]
        assert doc["size"] == SIZE and doc["md5"] == md5(text(5))
        # 4,000 in documents + 4,000 reserved by part4: a third 4,000 bytes drops part4
        assert srv.services.uploads.reserved("bob") == (1, SIZE)
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="new.txt", size=SIZE, md5=md5(text(7)))
        assert begin["offset"] == 0 and ids[4] not in partials(srv)
        await c.close()


async def test_the_upload_limit_counts_abandoned_partials(tmp_path):
    async with kb_server(tmp_path, {"max_uploads_per_user": 2}) as (srv, addr):
        ids = [await abandon(srv, addr, "bob", f"p{i}.txt", text(i)) for i in range(5)]
        assert set(partials(srv)) == set(ids[-2:])
        assert srv.services.uploads.reserved("bob") == (2, 2 * SIZE)


async def test_live_uploads_are_never_dropped_and_refusals_say_why(tmp_path):
    knowledge = {"user_quota_bytes": 10_000, "max_uploads_per_user": 2}
    async with kb_server(tmp_path, knowledge) as (srv, addr):
        a, b = await connect(addr, "bob"), await connect(addr, "bob")
        await a.call(MsgType.KB_UPLOAD_BEGIN, name="a.txt", size=SIZE, md5=md5(text(1)))
        with pytest.raises(ReplyError) as exc:           # 4,000 live + 7,000 > 10,000
            await b.call(MsgType.KB_UPLOAD_BEGIN, name="b.txt", size=7000, md5=md5(b"b" * 7000))
        msg = exc.value.body["message"]
        assert exc.value.code == "QUOTA_EXCEEDED" and "user_quota_bytes" in msg and "4000 reserved" in msg
        await b.call(MsgType.KB_UPLOAD_BEGIN, name="b.txt", size=SIZE, md5=md5(text(2)))
        with pytest.raises(ReplyError) as exc:           # two live uploads: the limit
            await b.call(MsgType.KB_UPLOAD_BEGIN, name="c.txt", size=10, md5=md5(b"c" * 10))
        assert exc.value.code == "QUOTA_EXCEEDED" and "max_uploads_per_user" in exc.value.body["message"]
        assert len(partials(srv)) == 2
        for c in (a, b):
            await c.close()


async def test_a_restarted_server_counts_the_partials_on_disk(tmp_path):
    knowledge = {"user_quota_bytes": 10_000}
    async with kb_server(tmp_path, knowledge) as (srv, addr):
        old = await abandon(srv, addr, "bob", "old.txt", text(1))
        new = await abandon(srv, addr, "bob", "new.txt", text(2))
        root = srv.services.uploads.root
    for p in (root / f"{old}.part", root / f"{old}.json"):
        os.utime(p, (os.stat(root / f"{new}.part").st_mtime - 60,) * 2)   # older than new.txt, not expired
    async with kb_server(tmp_path, knowledge) as (srv, addr):
        assert srv.services.uploads.reserved("bob") == (2, 2 * SIZE)
        c = await connect(addr, "bob")
        again = await c.call(MsgType.KB_UPLOAD_BEGIN, name="new.txt", size=SIZE, md5=md5(text(2)))
        assert again["upload_id"] == new and again["offset"] == SIZE       # a resume drops nothing
        assert set(partials(srv)) == {old, new}
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="third.txt", size=SIZE, md5=md5(text(3)))
        assert begin["offset"] == 0 and set(partials(srv)) == {new, begin["upload_id"]}
        doc = (await c.call(MsgType.KB_UPLOAD_END, upload_id=again["upload_id"]))["document"]
        assert doc["md5"] == md5(text(2))
        await c.close()

"""List replies over max_message_size hold fewer items, never dropped (docs/protocol.md §3, "Size"):
SESSION_LIST and KB_LIST page the rest (``has_more``, ``next_before``), HISTORY_SEARCH and KB_SEARCH
keep their best hits and say ``truncated``. Over loopback, with the smallest allowed limit (65535)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import orjson

from client import kb as kbclient
from client.connection import Client
from protocol import MsgType
from server.auth import LOCAL_USER
from server.fit import SLACK, fit_items
from testkit.server import ReplyError, V3Client, running_server

LIMIT = 65535
TITLE = "😀" * 190                   # 760 bytes of UTF-8: ~90 such sessions fill 64 KiB
NAME = "📄" * 245                    # a 255-character document name with "%06d.txt"


def _size(msg) -> int:
    return len(orjson.dumps(msg.body))


def test_fit_items_keeps_the_first_items_and_at_least_one() -> None:
    body = {"re": 1, "items": [{"n": i, "t": "x" * 100} for i in range(50)], "has_more": False}
    one = len(orjson.dumps(body["items"][0])) + 1
    head = len(orjson.dumps({**body, "items": []}))
    assert fit_items(body, "items", 10 ** 6) == 50
    assert fit_items(body, "items", SLACK + head + 3 * one) == 3
    assert fit_items(body, "items", SLACK + head + 3 * one - 1) == 2
    assert fit_items(body, "items", 10) == 1
    assert fit_items({"items": []}, "items", 10) == 0


async def test_session_list_over_the_limit_pages_instead_of_failing(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_message_size=LIMIT) as (srv, addr):
        store = srv.services.store
        made = {(await store.create(LOCAL_USER, title=f"{TITLE}{i:05d}")).session_id for i in range(130)}
        c = await V3Client.connect(addr, new_session=False)
        seen: list[str] = []
        before, pages = None, 0
        while True:
            msg = await c.request(MsgType.SESSION_LIST, limit=200, **({"before": before} if before else {}))
            assert msg.type == MsgType.RESPONSE, msg.body
            assert _size(msg) <= LIMIT and "truncated" not in msg.body
            seen += [s["session_id"] for s in msg.body["sessions"]]
            pages += 1
            if not msg.body["has_more"]:
                assert msg.body["next_before"] is None
                break
            before = msg.body["next_before"]
        assert pages >= 2 and len(seen) == len(set(seen)) and set(seen) == made   # each once, in order
        first = await c.call(MsgType.SESSION_LIST, limit=200)
        assert [s["session_id"] for s in first["sessions"]] == seen[:len(first["sessions"])]
        assert (await c.call(MsgType.SESSION_LIST, limit=5))["sessions"] == first["sessions"][:5]
        await c.close()


async def test_history_search_over_the_limit_keeps_the_best_hits_marked(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_message_size=LIMIT) as (srv, addr):
        store = srv.services.store
        for i in range(120):
            rec = await store.create(LOCAL_USER, title=f"{TITLE}{i:05d}")
            await store.append(rec.session_id, "user", f"where is the zebra-archive bucket number {i}?")
        c = await V3Client.connect(addr, new_session=False)
        msg = await c.request(MsgType.HISTORY_SEARCH, query="zebra-archive bucket", limit=200)
        assert msg.type == MsgType.RESPONSE, msg.body
        hits = msg.body["hits"]
        assert _size(msg) <= LIMIT and msg.body["truncated"] is True and 0 < len(hits) < 120
        few = await c.call(MsgType.HISTORY_SEARCH, query="zebra-archive bucket", limit=10)
        assert "truncated" not in few and len(few["hits"]) == 10
        assert [h["message_id"] for h in few["hits"]] == [h["message_id"] for h in hits[:10]]   # the best first
        await c.close()


async def _upload(c: V3Client, name: str, data: bytes) -> dict:
    from protocol.binary import encode_data
    begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=hashlib.md5(data).hexdigest())
    c.send_bytes(c.codec.send_raw(MsgType.KB_UPLOAD_DATA, encode_data(begin["handle"], 0, data)))
    return (await c.call(MsgType.KB_UPLOAD_END, upload_id=begin["upload_id"]))["document"]


async def test_kb_list_pages_by_size_and_by_limit_and_old_requests_still_work(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_message_size=LIMIT) as (srv, addr):
        c = await V3Client.connect(addr, new_session=False)
        ids = [(await _upload(c, f"{NAME}{i:06d}.txt", b"document number %d\n" % i))["doc_id"] for i in range(60)]
        # an old client's request (no limit, no cursor): as many as fit, and where the rest is
        msg = await c.request(MsgType.KB_LIST)
        assert msg.type == MsgType.RESPONSE, msg.body
        assert _size(msg) <= LIMIT and msg.body["has_more"] is True and 0 < len(msg.body["documents"]) < 60
        seen = [d["doc_id"] for d in msg.body["documents"]]
        before = msg.body["next_before"]
        while before is not None:
            page = await c.call(MsgType.KB_LIST, before=before)
            seen += [d["doc_id"] for d in page["documents"]]
            before = page["next_before"]
            assert page["has_more"] is (before is not None)
        assert sorted(seen) == sorted(ids) and len(seen) == 60
        async with Client(*addr) as client:        # the client library walks the pages for kb list
            assert [d.doc_id for d in await kbclient.list_documents(client)] == seen
        # with a limit: pages of at most that many, newest first, the same order
        by_seven, before = [], None
        while True:
            page = await c.call(MsgType.KB_LIST, limit=7, **({"before": before} if before else {}))
            assert len(page["documents"]) <= 7
            by_seven += [d["doc_id"] for d in page["documents"]]
            if not page["has_more"]:
                break
            before = page["next_before"]
        assert by_seven == seen
        everything = await c.call(MsgType.KB_LIST, limit=7, collection=f"user:{LOCAL_USER}")
        assert [d["doc_id"] for d in everything["documents"]] == seen[:7]
        for bad in [{"before": "no cursor"}, {"limit": 0}, {"limit": 201}]:
            try:
                await c.call(MsgType.KB_LIST, **bad)
            except ReplyError as exc:
                assert exc.code == "INVALID_MESSAGE"
            else:
                raise AssertionError(f"{bad} was accepted")
        await c.close()


async def test_kb_search_over_the_limit_keeps_the_best_hits_marked(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_message_size=LIMIT) as (srv, addr):
        c = await V3Client.connect(addr, new_session=False)
        for i in range(60):
            await _upload(c, f"{NAME}{i:06d}.txt", b"the walrus protocol number %d\n" % i)
        msg = await c.request(MsgType.KB_SEARCH, query="walrus protocol", limit=100)
        assert msg.type == MsgType.RESPONSE, msg.body
        assert _size(msg) <= LIMIT and msg.body["truncated"] is True and 0 < len(msg.body["hits"]) < 60
        await c.close()

"""MEMORY_LIST and CLIENT_LIST replies over max_message_size hold fewer items, never dropped
(docs/protocol.md §3, "Size"): MEMORY_LIST keeps the newest items (still oldest first), CLIENT_LIST
the oldest connections, both marked ``truncated``. Over loopback, with the smallest allowed limit."""
from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from protocol import MsgType
from server.auth import LOCAL_USER, hash_token
from server.fit import SLACK, fit_last_items
from server.memory.user_store import MemoryItem
from testkit.server import V3Client, poll, running_server

LIMIT = 65535
TEXT = "生产数据库的主机名是 db-prod-{n:03d}，备份在每天凌晨三点运行。" * 8   # ~1.2 KB of UTF-8 per item
LONG_USER = "u" * 64                  # the longest user id: ~250 bytes per ClientInfo


def _size(msg) -> int:
    return len(orjson.dumps(msg.body))


def test_fit_last_items_keeps_the_last_items_and_at_least_one() -> None:
    body = {"re": 1, "items": [{"n": i, "t": "x" * 100} for i in range(10, 60)]}   # (same sizes)
    one = len(orjson.dumps(body["items"][0])) + 1
    head = len(orjson.dumps({**body, "items": []}))
    assert fit_last_items(body, "items", 10 ** 6) == 50
    assert fit_last_items(body, "items", SLACK + head + 3 * one) == 3
    assert fit_last_items(body, "items", 10) == 1
    assert fit_last_items({"items": []}, "items", 10) == 0


async def test_memory_list_over_the_limit_keeps_the_newest_items_marked(tmp_path: Path) -> None:
    # 600 items: even with every text cut to nothing they are over 64 KiB (the old answer: an ERROR)
    async with running_server(tmp_path, memory="auto", max_message_size=LIMIT,
                              sections={"user_memory": {"max_items": 1000}}) as (srv, addr):
        store = srv.services.memory.user_memory.store
        items = [MemoryItem(f"m{n:03d}", "fact", TEXT.format(n=n), "s_20261122_000000000000", n + 1,
                            f"2026-11-22T{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}+00:00") for n in range(600)]
        c = await V3Client.connect(addr, new_session=False)
        await store.add(LOCAL_USER, items[:3])              # a few items fit: the whole list, not marked
        few = await c.call(MsgType.MEMORY_LIST)
        assert [i["id"] for i in few["items"]] == [i.id for i in items[:3]] and "truncated" not in few
        await store.add(LOCAL_USER, items[3:])
        msg = await c.request(MsgType.MEMORY_LIST)
        assert msg.type == MsgType.RESPONSE, msg.body          # (was ERROR MESSAGE_TOO_LARGE)
        got = [i["id"] for i in msg.body["items"]]
        assert _size(msg) <= LIMIT and msg.body["truncated"] is True and msg.body["enabled"] is True
        assert 0 < len(got) < 600 and got == [i.id for i in items[-len(got):]]    # the newest, oldest first
        assert all(i["text"] == TEXT.format(n=int(i["id"][1:])) for i in msg.body["items"])   # whole texts
        await c.close()


async def test_client_list_over_the_limit_keeps_the_oldest_connections_marked(tmp_path: Path) -> None:
    users = {"auth": {"users": [{"user_id": "root", "token_sha256": hash_token("t-root"), "admin": True},
                                {"user_id": LONG_USER, "token_sha256": hash_token("t-long")}]}}
    async with running_server(tmp_path, sections=users, max_message_size=LIMIT, max_clients=400,
                              max_clients_per_ip=0) as (srv, addr):
        root = await V3Client.connect(addr, token="t-root", new_session=False)
        others: list[V3Client] = []
        for _ in range(12):                    # 360 connections (~80 KB of ClientInfo), 30 at a time
            others += await asyncio.gather(*(V3Client.connect(addr, token="t-long", new_session=False)
                                             for _ in range(30)))
        await poll(lambda: len(srv.services.connections) == 361, what="every connection accepted")
        msg = await root.request(MsgType.CLIENT_LIST)
        assert msg.type == MsgType.RESPONSE, msg.body          # (was ERROR MESSAGE_TOO_LARGE)
        clients = msg.body["clients"]
        assert _size(msg) <= LIMIT and msg.body["truncated"] is True and 1 < len(clients) < 361
        ids = sorted(c.conn_id for c in srv.services.connections)
        assert [c["id"] for c in clients] == ids[:len(clients)]               # the oldest, in order
        assert clients[0]["me"] is True and {c["user"] for c in clients[1:]} == {LONG_USER}
        await asyncio.gather(*(c.close() for c in others))
        await poll(lambda: len(srv.services.connections) == 1, what="the others gone")
        alone = await root.call(MsgType.CLIENT_LIST)
        assert [c["id"] for c in alone["clients"]] == ids[:1] and "truncated" not in alone
        await root.close()

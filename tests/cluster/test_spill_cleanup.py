"""Events too large for a notification are spilled to ``nplt_cluster_events`` (server.cluster_relay):
the rows go when they are old, by a cleanup that does not wait for the next spill, and at once when
their session is purged, deleted or cleared; a node where no client follows the session does not read
them."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

import server.cluster_relay as cluster_relay
import storage.pg.relay as pg_relay
from protocol import MsgType as T
from testkit.server import V3Client, poll

from cluster.conftest import clients_of_one_session, node

BIG = "!tool " + "big argument " * 800        # a tool call whose arguments are spilled


async def _rows_of(url: str, session_id: str | None = None) -> int:
    """Spilled rows (of one session: those whose event names it)."""
    con = await asyncpg.connect(url)
    try:
        if session_id is None:
            return await con.fetchval("SELECT count(*) FROM nplt_cluster_events")
        return await con.fetchval("SELECT count(*) FROM nplt_cluster_events "
                                  "WHERE position($1 in convert_from(body, 'UTF8')) > 0", session_id)
    finally:
        await con.close()


async def _no_rows_of(url: str, session_id: str | None = None) -> bool:
    return await _rows_of(url, session_id) == 0


async def _big_turn(writer: V3Client, watcher: V3Client, session_id: str) -> None:
    r = await writer.call(T.CHAT_TEXT, session_id=session_id, text=BIG)
    seen = await watcher.turn_events(r["turn_id"], timeout=30)
    assert any(m.type == T.TOOL_CALL for m in seen)           # read from its row by the other node


async def test_old_spilled_events_are_deleted_without_waiting_for_another_spill(tmp_path, pg_url, monkeypatch):
    monkeypatch.setattr(cluster_relay, "SPILL_CLEANUP_S", 0.05)
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b") as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            await _big_turn(ca, cb, sid)
            assert await _rows_of(pg_url) > 0
            monkeypatch.setattr(pg_relay, "SPILL_KEEP_S", 0)    # they are old now
            await poll(lambda: _no_rows_of(pg_url), 10, "old rows deleted")


@pytest.mark.parametrize("action", ["purge", "delete", "clear"])
async def test_a_sessions_spilled_events_go_with_it(tmp_path, pg_url, action):
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b") as b:
        async with clients_of_one_session(a, b) as (ca, cb, sid):
            other = (await ca.call(T.SESSION_NEW))["session"]["session_id"]
            await cb.call(T.SESSION_SWITCH, session_id=other)
            await _big_turn(ca, cb, other)
            await cb.call(T.SESSION_SWITCH, session_id=sid)
            await _big_turn(ca, cb, sid)
            assert await _rows_of(pg_url, sid) > 0 and await _rows_of(pg_url, other) > 0
            if action == "clear":
                await ca.call(T.CLEAR_REQUEST, session_id=sid)
            else:
                await ca.call(T.SESSION_DELETE, session_id=sid)
                if action == "purge":
                    await ca.call(T.SESSION_PURGE, session_id=sid)
            await poll(lambda: _no_rows_of(pg_url, sid), 10, "the session's rows deleted")
            assert await _rows_of(pg_url, other) > 0                # (not the other session's)


async def test_a_node_where_nobody_follows_the_session_does_not_read_its_spilled_events(tmp_path, pg_url,
                                                                                       monkeypatch):
    reads: list = []
    read_spilled = cluster_relay.read_spilled

    async def counted(link, event_id):
        reads.append(link)
        return await read_spilled(link, event_id)
    monkeypatch.setattr(cluster_relay, "read_spilled", counted)
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b") as b:
        relay_b = b.services.cluster.relay
        ended: dict[str, asyncio.Event] = {}
        on_end = relay_b.on_end

        def end_seen(session_id: str, turn_id: str) -> None:
            on_end(session_id, turn_id)
            ended.setdefault(turn_id, asyncio.Event()).set()
        relay_b.on_end = end_seen
        ca = await V3Client.connect((a.host, a.port))
        cb = await V3Client.connect((b.host, b.port))          # node B has a client, in another session
        try:
            await poll(lambda: a.services.cluster.relay.peers, 10, "node A knowing node B")
            sid = (await ca.call(T.SESSION_NEW, title="followed on node A only"))["session"]["session_id"]
            assert not b.services.hub.session_subscribers(sid)
            r = await ca.call(T.CHAT_TEXT, session_id=sid, text=BIG)
            await ca.turn_events(r["turn_id"], timeout=30)
            # node B has handled the turn's end, so the spilled items before it too
            await asyncio.wait_for(ended.setdefault(r["turn_id"], asyncio.Event()).wait(), 30)
            assert await _rows_of(pg_url, sid) > 0
            assert b.store.link not in reads
            assert sid not in b.services.cluster.remote_turns
        finally:
            await ca.close()
            await cb.close()

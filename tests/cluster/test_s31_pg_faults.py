"""PostgreSQL faults around turns waiting for a session: a queued turn whose lock wait is cut by a
PostgreSQL restart queues again and runs once PostgreSQL is back (on another node or behind a turn
of its own node), and fails as STORAGE_UNAVAILABLE, saying its message was not stored, when
PostgreSQL stays away beyond the retry policy, never INTERNAL. And a regenerate sent to node A as
soon as a turn's TURN_END came from node B waits for node B to let go of the lock instead of being
refused. The restart tests use the session's restartable PostgreSQL (tests/conftest.py)."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from protocol import MsgType as T
from storage.pg.lock_holder import key_of
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, poll

from cluster.conftest import clients_of_one_session, node

ENDS = (T.TURN_END, T.TURN_ERROR)
PATIENT = {"pg_retry_attempts": 12}      # 10 ms doubled 12 times (5 s at most): a restart fits in it

WAITING = """
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid::bigint = ($1::bigint >> 32) & 4294967295 AND objid::bigint = $1::bigint & 4294967295"""


async def _queued_in_postgres(url: str, session_id: str, n: int = 1) -> None:
    """Until ``n`` claims of the session wait in PostgreSQL's lock queue."""
    probe = await asyncpg.connect(url)
    try:
        await poll(lambda: _waiting(probe, session_id, n), 10, "a claim queued in PostgreSQL")
    finally:
        await probe.close()


async def _waiting(probe: asyncpg.Connection, session_id: str, n: int) -> bool:
    return await probe.fetchval(WAITING, key_of("session", session_id)) >= n


async def _end(client: V3Client, turn_id: str, timeout: float = 30):
    return await client.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == turn_id, timeout)


async def _history(client: V3Client, sid: str) -> list[tuple[str, str]]:
    page = await client.call(T.HISTORY_REQUEST, session_id=sid, limit=50)
    return [(m["role"], m["content"]) for m in page["messages"]]


async def test_a_turn_queued_on_another_node_queues_again_after_a_restart_and_runs(tmp_path, restartable, url):
    agent = EchoAgent()
    storage = {**PATIENT, "pg_retry_backoff_ms": 100}     # node B queues again 200 ms after it reconnects
    async with node(tmp_path, url, "a", agent=agent, storage=storage) as a, \
            node(tmp_path, url, "b", storage=storage) as b, \
            clients_of_one_session(a, b) as (ca, cb, sid):
        r1 = await ca.call(T.CHAT_TEXT, text="!block first")
        await agent.wait_blocked()
        await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=r1["turn_id"])
        r2 = await cb.call(T.CHAT_TEXT, text="second, queued on B")
        assert r2["queued"] >= 1
        await _queued_in_postgres(url, sid)

        await asyncio.to_thread(restartable.stop)        # the wait's connection is cut, its queue gone
        restartable.start()
        # (before the fix: TURN_ERROR INTERNAL "connection was closed in the middle of operation" at once)
        await _queued_in_postgres(url, sid)              # queued again, behind node A's turn (taken back)
        assert a.services.cluster.holder.was_retaken(key_of("session", sid))
        agent.release()
        end1 = await _end(ca, r1["turn_id"])
        end2 = await _end(cb, r2["turn_id"])
        assert end1.type == T.TURN_END and end1.body["finish_reason"] == "stop"
        assert end2.type == T.TURN_END and end2.body["finish_reason"] == "stop", end2.body
        assert await _history(cb, sid) == [("user", "!block first"), ("assistant", "echo: !block first"),
                                           ("user", "second, queued on B"),
                                           ("assistant", "echo: second, queued on B")]


async def test_a_turn_queued_behind_its_own_nodes_turn_runs_after_a_restart(tmp_path, restartable, url):
    agent = EchoAgent()
    async with node(tmp_path, url, "a", agent=agent, storage=PATIENT) as a:
        ca = await V3Client.connect((a.host, a.port))
        try:
            sid = ca.session_id
            r1 = await ca.call(T.CHAT_TEXT, text="!block first")
            await agent.wait_blocked()
            r2 = await ca.call(T.CHAT_TEXT, text="second, queued")
            assert r2["queued"] == 1
            await _queued_in_postgres(url, sid)

            await asyncio.to_thread(restartable.stop)
            restartable.start()
            # the running turn's lock is taken back before the waiting turn queues again, so the
            # waiting turn does not take the session from the running one (whose answer is stored)
            await _queued_in_postgres(url, sid)
            assert a.services.cluster.holder.was_retaken(key_of("session", sid))
            agent.release()
            end1 = await _end(ca, r1["turn_id"])
            end2 = await _end(ca, r2["turn_id"])
            assert end1.type == T.TURN_END and end1.body["finish_reason"] == "stop", end1.body
            assert end2.type == T.TURN_END and end2.body["finish_reason"] == "stop", end2.body
            assert await _history(ca, sid) == [("user", "!block first"), ("assistant", "echo: !block first"),
                                               ("user", "second, queued"), ("assistant", "echo: second, queued")]
        finally:
            await ca.close()


async def test_a_queued_turn_fails_as_storage_unavailable_when_postgres_stays_away(tmp_path, restartable, url):
    agent = EchoAgent()
    async with node(tmp_path, url, "a", agent=agent, storage=PATIENT) as a, \
            node(tmp_path, url, "b", storage={"pg_retry_attempts": 2}) as b, \
            clients_of_one_session(a, b) as (ca, cb, sid):
        r1 = await ca.call(T.CHAT_TEXT, text="!block first")
        await agent.wait_blocked()
        await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=r1["turn_id"])
        r2 = await cb.call(T.CHAT_TEXT, text="second, queued on B")
        await _queued_in_postgres(url, sid)
        try:
            await asyncio.to_thread(restartable.stop)
            end2 = await _end(cb, r2["turn_id"])              # (before the fix: INTERNAL)
        finally:
            restartable.start()
        assert end2.type == T.TURN_ERROR
        assert end2.body["code"] == "STORAGE_UNAVAILABLE", end2.body
        assert "message was not stored" in end2.body["message"], end2.body
        agent.release()
        end1 = await _end(ca, r1["turn_id"])
        assert end1.type == T.TURN_END, end1.body
        assert await _history(cb, sid) == [("user", "!block first"), ("assistant", "echo: !block first")]
        r3 = await cb.call(T.CHAT_TEXT, text="again")                   # node B serves the session again
        end3 = await _end(cb, r3["turn_id"])
        assert end3.type == T.TURN_END and end3.body["message"]["content"] == "echo: again"


async def test_a_regenerate_right_after_another_nodes_turn_end_waits_for_its_lock(tmp_path, pg_url):
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b") as b, \
            clients_of_one_session(a, b) as (ca, cb, sid):
        relay = b.services.cluster.relay
        flush, gate = relay.flush, asyncio.Event()

        async def slow_flush() -> None:             # node B lets go of the lock only when the test says
            await gate.wait()
            await flush()
        relay.flush = slow_flush
        r = await cb.call(T.CHAT_TEXT, text="question")
        await cb.turn_events(r["turn_id"], timeout=30)                   # TURN_END seen, lock still held
        regenerate = asyncio.create_task(ca.call(T.CHAT_REGENERATE))
        try:
            await _queued_in_postgres(pg_url, sid)   # (before the fix: QUEUE_FULL "on another node" at once)
        finally:
            gate.set()
        g = await regenerate
        end = await _end(ca, g["turn_id"])
        assert end.type == T.TURN_END and end.body["message"]["content"] == "echo: question"
        relay.flush = flush


async def test_a_regenerate_while_another_node_runs_a_turn_is_still_refused(tmp_path, pg_url):
    agent = EchoAgent()
    async with node(tmp_path, pg_url, "a") as a, node(tmp_path, pg_url, "b", agent=agent) as b, \
            clients_of_one_session(a, b) as (ca, cb, sid):
        r = await cb.call(T.CHAT_TEXT, text="warm up")
        await cb.turn_events(r["turn_id"], timeout=30)
        r = await cb.call(T.CHAT_TEXT, text="!block running")
        await agent.wait_blocked()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ReplyError) as refused:
            await ca.call(T.CHAT_REGENERATE)
        assert refused.value.code == "QUEUE_FULL"
        assert loop.time() - started < 5
        agent.release()
        await cb.turn_events(r["turn_id"], timeout=30)
        probe = await asyncpg.connect(pg_url)
        try:
            assert not await _waiting(probe, sid, 1)          # the claim given up left nothing queued
        finally:
            await probe.close()
        assert [m for m, _ in await _history(ca, sid)] == ["user", "assistant"] * 2

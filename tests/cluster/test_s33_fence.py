"""The answer's append is fenced (storage/pg/appends.py, ``FENCED_SQL``): a turn's answer is stored
only if its session is still as the turn left it — not deleted or cleared since, and nothing but
superseded messages stored after the turn's user message — checked under the session row's lock in
the append's own statement. A node that stalled mid-turn (SIGSTOP, a GC pause, a frozen VM) while
PostgreSQL dropped its connections has not processed the closed sockets yet when it resumes: its
in-memory view says it still holds the session's lock (``still_held``, no round trip), while another
node took the session over (closed the turn as interrupted and ran its own, or cleared the session).
Before the fence, its answer was stored anyway: two answers in a row, or an answer in the session
just cleared. Here the stall is simulated deterministically: node A's turn blocks, its lock's
backend is terminated from a third connection (node B, queued for the lock, is granted it at once),
and node A's ``still_held`` is made to answer True, as a node that has not noticed yet would."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import asyncpg
import pytest

import server.sessions as sessions_module
from protocol import MsgType as T
from storage import StorageConfig
from storage.pg.appends import SessionMoved
from storage.pg.lock_holder import key_of
from storage.pg.store import PgHistoryStore
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, poll

from cluster.conftest import node

LINES = 4            # pg_lock_connections' default: line 0 also holds the node's liveness lock
ENDS = (T.TURN_END, T.TURN_ERROR)
LOCK_SQL = ("SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND classid::bigint = ($1::bigint >> 32) & 4294967295 AND objid::bigint = $1::bigint & 4294967295")


@pytest.fixture
async def store(pg_url, tmp_path):
    s = await PgHistoryStore.open(StorageConfig(root=str(tmp_path), url=pg_url))
    try:
        yield s
    finally:
        await s.close()


async def _visible(store: PgHistoryStore, sid: str) -> list[tuple[int, str, str]]:
    return [(m.id, m.role, m.content) for m in await store.messages(sid)]


# -- the store ----------------------------------------------------------------------------------------

async def test_a_fenced_answer_is_stored_while_the_session_is_as_its_turn_left_it(store):
    sid = (await store.create("alice")).session_id
    u = await store.append(sid, "user", "question")
    before = store.appends.statements
    a = await store.append(sid, "assistant", "answer", fence=u.id)
    assert store.appends.statements - before == 1                 # the check is in the append's statement
    assert await _visible(store, sid) == [(1, "user", "question"), (2, "assistant", "answer")]
    # a regenerate: the old answer (with a NUL in it) is superseded, the new one is fenced on the same
    # user message and stored after it
    await store.update(sid, replace(a, content="nul \x00 inside", metadata={**a.metadata, "superseded": True}))
    again = await store.append(sid, "assistant", "answer again", fence=u.id)
    assert again.id == 3
    assert (await store.get(sid)).message_count == 3


async def test_a_fenced_answer_is_refused_after_another_message_a_clear_or_a_delete(store):
    sid = (await store.create("alice")).session_id
    u = await store.append(sid, "user", "question")
    await store.append(sid, "assistant", "closed as interrupted by another node")
    with pytest.raises(SessionMoved) as moved:
        await store.append(sid, "assistant", "late answer", fence=u.id)
    assert moved.value.why == "written" and moved.value.code == "STORAGE_UNAVAILABLE"
    assert [c for _, _, c in await _visible(store, sid)] == ["question", "closed as interrupted by another node"]
    assert (await store.get(sid)).message_count == 2

    u2 = await store.append(sid, "user", "second question")
    await store.clear(sid)
    with pytest.raises(SessionMoved) as moved:
        await store.append(sid, "assistant", "answer after the clear", fence=u2.id)
    assert moved.value.why == "cleared"
    assert await _visible(store, sid) == [] and (await store.get(sid)).message_count == 0

    sid2 = (await store.create("alice")).session_id
    u3 = await store.append(sid2, "user", "q")
    await store.clear(sid2, purge=True)
    with pytest.raises(SessionMoved):
        await store.append(sid2, "assistant", "a", fence=u3.id)

    sid3 = (await store.create("alice")).session_id
    u4 = await store.append(sid3, "user", "q")
    await store.delete(sid3)
    with pytest.raises(SessionMoved) as moved:
        await store.append(sid3, "assistant", "a", fence=u4.id)
    assert moved.value.why == "deleted"
    await store.restore(sid3)
    assert [c for _, _, c in await _visible(store, sid3)] == ["q"]


async def test_each_append_of_a_fenced_batch_gets_its_own_outcome(store):
    """Fenced and unfenced appends that arrive together still share one statement; a refused fence
    fails only its own append (and an unknown session is NotFound, as before). An append to the
    same session earlier in the batch counts as a message stored after the fence."""
    ok, moved, plain, twice = [(await store.create("alice")).session_id for _ in range(4)]
    uo = await store.append(ok, "user", "q")
    um = await store.append(moved, "user", "q")
    await store.append(moved, "assistant", "another node's")
    ut = await store.append(twice, "user", "q")
    before = store.appends.statements
    got = await asyncio.gather(store.append(ok, "assistant", "a", fence=uo.id),
                               store.append(moved, "assistant", "late", fence=um.id),
                               store.append(plain, "user", "hello"),
                               store.append("s_20260101_000000000000", "user", "nobody", fence=1),
                               store.append(twice, "user", "first in the batch"),
                               store.append(twice, "assistant", "fenced after it", fence=ut.id),
                               return_exceptions=True)
    assert store.appends.statements - before == 1
    assert got[0].id == 2 and got[2].id == 1 and got[4].id == 2
    assert isinstance(got[1], SessionMoved) and got[1].why == "written"
    assert type(got[3]).__name__ == "NotFound"
    assert isinstance(got[5], SessionMoved) and got[5].why == "written"
    assert [c for _, _, c in await _visible(store, moved)] == ["q", "another node's"]
    assert [c for _, _, c in await _visible(store, twice)] == ["q", "first in the batch"]


@pytest.mark.parametrize("meanwhile", ["append", "clear"])
async def test_the_fence_is_checked_under_the_session_rows_lock(store, pg_url, meanwhile):
    """Another node's append or clear, in a transaction not committed yet when the fenced append's
    statement starts, commits while that statement waits for the session's row: the statement
    checks the fence on the row as committed, so the answer is refused (checked on the statement's
    snapshot alone, it would have gone in after the other node's message)."""
    sid = (await store.create("alice")).session_id
    u = await store.append(sid, "user", "question")
    other = await asyncpg.connect(pg_url)
    watch = await asyncpg.connect(pg_url)
    try:
        tx = other.transaction()
        await tx.start()
        if meanwhile == "append":
            await other.execute("SELECT * FROM nplt_append_many($1::text[], $2::text[], $3::bytea[], $4::bytea[], "
                                "$5::text[], $6::bigint[])", [sid], ["2026-11-27T00:00:00+00:00"], [b"x"],
                                [b'{"role":"assistant","content":"interrupted","timestamp":"2026-11-27T00:00:00+00:00",'
                                 b'"tool_calls":[],"metadata":{}}'], ["interrupted"], [None])
        else:
            await other.execute("UPDATE nplt_sessions SET cleared_through = next_id - 1, message_count = 0 "
                                "WHERE session_id = $1", sid)
        task = asyncio.create_task(store.append(sid, "assistant", "late answer", fence=u.id))
        other_pid = other.get_server_pid()

        async def blocked() -> bool:
            return bool(await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", other_pid))
        await poll(blocked, 30, "the fenced append waiting for the session's row")
        assert not task.done()
        await tx.commit()
        with pytest.raises(SessionMoved) as moved:
            await task
        assert moved.value.why == ("written" if meanwhile == "append" else "cleared")
    finally:
        await other.close()
        await watch.close()
    visible = [c for _, _, c in await _visible(store, sid)]
    assert visible == (["question", "interrupted"] if meanwhile == "append" else [])


# -- two nodes ----------------------------------------------------------------------------------------

async def _session_off_line_0(client: V3Client) -> str:
    """A session of ``client``'s whose lock is not on the node lock's line (whose backend the test
    terminates: node A's liveness lock stays, so node B does not take it for dead)."""
    sid = client.session_id
    while key_of("session", sid) % LINES == 0:
        sid = (await client.call(T.SESSION_NEW, title="not on line 0"))["session"]["session_id"]
    await client.call(T.SESSION_SWITCH, session_id=sid)
    return sid


async def _lock_rows(probe: asyncpg.Connection, sid: str) -> list[tuple[int, bool]]:
    return [(r["pid"], r["granted"]) for r in await probe.fetch(LOCK_SQL, key_of("session", sid))]


async def _queued(probe: asyncpg.Connection, sid: str) -> bool:
    """Whether a claim of the session's lock waits in PostgreSQL's queue."""
    return any(not granted for _, granted in await _lock_rows(probe, sid))


async def _stall_and_cut(a, probe: asyncpg.Connection, sid: str, monkeypatch) -> None:
    """Node A "stalled" through the cut: its view of its lock is not updated (``still_held`` says
    True, as after a SIGSTOP before the loop processed the closed socket); then its lock's backend
    is terminated, and the claim of node B queued behind it is granted at once."""
    async def stale(session_id: str, user_message_id: int) -> bool:
        return True
    monkeypatch.setattr(a.services.cluster.turn_lock, "still_held", stale)
    rows = await _lock_rows(probe, sid)
    holder = [pid for pid, granted in rows if granted]
    assert len(holder) == 1 and any(not granted for _, granted in rows)      # node B waits behind it
    assert await probe.fetchval("SELECT pg_terminate_backend($1)", holder[0])


async def test_a_stalled_nodes_answer_is_not_stored_after_the_turn_of_the_node_that_took_over(
        tmp_path, url, monkeypatch):
    agent = EchoAgent()
    async with node(tmp_path, url, "a", agent=agent) as a, node(tmp_path, url, "b") as b:
        ca = await V3Client.connect((a.host, a.port))
        cb = None
        probe = await asyncpg.connect(url)
        try:
            sid = await _session_off_line_0(ca)
            cb = await V3Client.connect((b.host, b.port), session_id=sid)
            r = await ca.call(T.CHAT_TEXT, text="!block a long answer")
            tid = r["turn_id"]
            await agent.wait_blocked()
            await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)
            queued = await cb.call(T.CHAT_TEXT, text="from b")           # waits in PostgreSQL's queue
            assert queued["queued"] == 1
            await poll(lambda: _queued(probe, sid), 30, "node B's claim queued")

            await _stall_and_cut(a, probe, sid, monkeypatch)
            mine = await cb.turn_events(queued["turn_id"], timeout=30)   # node B closes A's turn, runs its own
            assert mine[-1].type == T.TURN_END

            agent.release()                                              # node A "resumes" with its answer
            a_end = await ca.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == tid, 30)
            assert a_end.type == T.TURN_ERROR and a_end.body["code"] == "STORAGE_UNAVAILABLE"
            stored = [(m.role, m.content, m.metadata.get("finish_reason"))
                      for m in await b.store.messages(sid, after_id=-1)]
            assert stored == [("user", "!block a long answer", None), ("assistant", "", "interrupted"),
                              ("user", "from b", None), ("assistant", "echo: from b", "stop")]
        finally:
            agent.release()
            for c in (ca, cb):
                if c is not None:
                    await c.close()
            await probe.close()


async def test_a_stalled_nodes_answer_is_not_stored_in_the_session_another_node_cleared(
        tmp_path, url, monkeypatch):
    monkeypatch.setattr(sessions_module, "TURN_STOP_WAIT_S", 0.2)       # (10 s by default)
    agent = EchoAgent()
    async with node(tmp_path, url, "a", agent=agent) as a, \
            node(tmp_path, url, "b", sections={"cluster": {"ending_turn_wait_ms": 60_000}}) as b:
        # node A stalled: the cancel node B asks for reaches it only when the test says so
        monkeypatch.setattr(a.services.cluster.remote_cancel, "on_control", lambda n, item: None)
        ca = await V3Client.connect((a.host, a.port))
        cb = None
        probe = await asyncpg.connect(url)
        try:
            sid = await _session_off_line_0(ca)
            cb = await V3Client.connect((b.host, b.port), session_id=sid)
            r = await ca.call(T.CHAT_TEXT, text="!block secret plan")
            tid = r["turn_id"]
            await agent.wait_blocked()
            await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)
            clear = asyncio.create_task(cb.call(T.CLEAR_REQUEST, session_id=sid, timeout=60))
            await poll(lambda: _queued(probe, sid), 30, "node B's clear waiting for the session's lock")

            await _stall_and_cut(a, probe, sid, monkeypatch)
            reply = await clear                                          # A's turn closed, then cleared
            assert reply["cleared"] == 2
            assert await b.store.messages(sid) == []

            agent.release()
            a_end = await ca.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == tid, 30)
            assert a_end.type == T.TURN_ERROR and a_end.body["code"] == "STORAGE_UNAVAILABLE"
            assert await b.store.messages(sid) == []                     # no answer after the clear
            assert (await b.store.get(sid)).message_count == 0
            page = await cb.call(T.HISTORY_REQUEST, session_id=sid)
            assert page["messages"] == []
        finally:
            agent.release()
            for c in (ca, cb):
                if c is not None:
                    await c.close()
            await probe.close()

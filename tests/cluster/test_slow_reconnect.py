"""PostgreSQL restarts under a running turn: a live node that is slow to reconnect is not taken for
dead (a watcher whose own connection broke gives it ``reconnect_grace_ms``; the node takes back its
liveness lock and its running turns' session locks as soon as it can), while a node killed after the
restart is still closed as interrupted once the grace is over, and one dying without a restart at
once. A turn whose session lock another node took meanwhile is told so (``still_held``), and each
client sees one end a turn. These tests restart a PostgreSQL server of their own."""
from __future__ import annotations

import asyncio
import signal
import time

import asyncpg

from pg.pgserver import EmbeddedPostgres
from protocol import MsgType as T
from storage.pg.lock_holder import key_of
from testkit.echo_agent import EchoAgent
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client, answer_text, poll

from cluster.conftest import clients_of_one_session, node
from cluster.test_node_death import start_node_process

LINES = 4                    # pg_lock_connections' default: line 0 also holds the node's liveness lock
SLOW = {"pg_retry_backoff_ms": 3000}      # a node taking its locks back 3 s after PostgreSQL's return
ENDS = (T.TURN_END, T.TURN_ERROR)


async def _restart(server: EmbeddedPostgres) -> None:
    """A real restart: every connection of every node is dropped, and refused until it is back. (The
    start blocks the event loop for its second: the postmaster dies with the thread that started it,
    so it is started from this one.)"""
    await asyncio.to_thread(server.stop)
    server.start()


def _ends(client: V3Client, tid: str) -> list[tuple[int, str | None]]:
    return [(m.type, m.body.get("finish_reason")) for m in client.inbox
            if m.type in ENDS and m.body.get("turn_id") == tid]


async def _session_off_line_0(client: V3Client) -> str:
    """A session of ``client``'s whose lock is not on the node lock's line (which a test may break)."""
    sid = client.session_id
    while key_of("session", sid) % LINES == 0:
        sid = (await client.call(T.SESSION_NEW, title="not on line 0"))["session"]["session_id"]
    await client.call(T.SESSION_SWITCH, session_id=sid)
    return sid


async def test_a_live_node_slow_to_reconnect_keeps_its_turn_through_a_restart(tmp_path, restartable, url):
    agent = EchoAgent()
    async with node(tmp_path, url, "a", agent=agent, storage=SLOW) as a, \
            node(tmp_path, url, "b", sections={"cluster": {"reconnect_grace_ms": 8000}}) as b, \
            clients_of_one_session(a, b) as (ca, cb, sid):
        r = await ca.call(T.CHAT_TEXT, text="warm up")                  # node B watches node A now
        await cb.turn_events(r["turn_id"], timeout=30)
        r = await ca.call(T.CHAT_TEXT, text="!block a long answer")
        tid = r["turn_id"]
        await agent.wait_blocked()
        await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)      # node B follows it
        holder = a.services.cluster.holder
        taken = holder.node_locks

        await _restart(restartable)
        # node B is back at once, node A only at its next attempt, up to 3 s later: before the fix
        # node B took it for dead meanwhile and closed its turn as interrupted under it
        await poll(lambda: holder.node_locks > taken, 30, "node A's liveness lock taken back")
        assert await holder.holds(key_of("session", sid))              # and its turn's session lock
        assert holder.was_retaken(key_of("session", sid))
        assert await a.services.cluster.turn_lock.still_held(sid, r["user_message"]["id"])
        assert b.services.cluster.interrupted == 0

        agent.release()
        events = await ca.turn_events(tid, timeout=30)
        assert events[-1].type == T.TURN_END and events[-1].body["finish_reason"] == "stop"
        assert answer_text(events).endswith("echo: !block a long answer")
        end = await cb.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == tid, 30)
        assert end.type == T.TURN_END and end.body["finish_reason"] == "stop"

        r2 = await ca.call(T.CHAT_TEXT, text="after")                   # (later than anything of the turn)
        await ca.turn_events(r2["turn_id"], timeout=30)
        await cb.turn_events(r2["turn_id"], timeout=30)
        assert _ends(ca, tid) == [] and _ends(cb, tid) == []           # one end a turn on both nodes
        page = await cb.call(T.HISTORY_REQUEST, session_id=sid, limit=50)
        assert [(m["role"], m["content"]) for m in page["messages"]] == [
            ("user", "warm up"), ("assistant", "echo: warm up"),
            ("user", "!block a long answer"), ("assistant", "echo: !block a long answer"),
            ("user", "after"), ("assistant", "echo: after")]
        assert b.services.cluster.interrupted == 0


async def test_a_node_killed_after_a_restart_is_closed_once_the_grace_is_over(tmp_path, restartable, url):
    grace_s = 2.0
    async with ScriptedLLM() as llm, \
            node(tmp_path, url, "b", sections={"cluster": {"reconnect_grace_ms": grace_s * 1000}}) as b:
        proc, port = await start_node_process(tmp_path, url, {"NPLT_LLM_BASE_URL": llm.base_url})
        ca = cb = probe = None
        try:
            ca = await V3Client.connect(("127.0.0.1", port))
            sid = ca.session_id
            cb = await V3Client.connect((b.host, b.port), session_id=sid)
            llm.push(Reply.text("warm ", "up"), Reply.stalled("partial ", "answer"))
            r = await ca.call(T.CHAT_TEXT, text="warm up")              # node B watches node A now
            await cb.turn_events(r["turn_id"], timeout=30)
            r = await ca.call(T.CHAT_TEXT, text="a long story")
            tid = r["turn_id"]
            followed = ""
            while followed != "partial answer":
                followed += (await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)).body["text"]

            await _restart(restartable)
            probe = await asyncpg.connect(url)
            mine = "nplt-node:" + b.services.cluster.node_id

            async def a_holds_its_session() -> bool:                   # node A is back, with its turn's lock
                return bool(await probe.fetchval(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                    "AND starts_with(a.application_name, 'nplt-node:') AND a.application_name <> $1 "
                    "AND l.classid::bigint = ($2::bigint >> 32) & 4294967295 "
                    "AND l.objid::bigint = $2::bigint & 4294967295", mine, key_of("session", sid)))
            await poll(a_holds_its_session, 30, "node A holding its turn's lock again")

            proc.send_signal(signal.SIGKILL)                            # within node B's grace
            assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
            killed = time.monotonic()
            end = await cb.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == tid, grace_s + 5)
            took = time.monotonic() - killed
            assert end.type == T.TURN_END and end.body["finish_reason"] == "interrupted"
            assert end.body["message"]["metadata"]["answers"] == r["user_message"]["id"]
            assert took < grace_s + 1.5, took
            assert b.services.cluster.interrupted == 1
            assert (await cb.call(T.SESSION_INFO, session_id=sid))["session"]["running"] is False
        finally:
            for c in (ca, cb):
                if c is not None:
                    await c.close()
            if probe is not None:
                await probe.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_a_node_dying_without_a_restart_is_closed_at_once(tmp_path, url):
    async with ScriptedLLM() as llm, \
            node(tmp_path, url, "b", sections={"cluster": {"reconnect_grace_ms": 60_000}}) as b:
        proc, port = await start_node_process(tmp_path, url, {"NPLT_LLM_BASE_URL": llm.base_url})
        ca = cb = None
        try:
            ca = await V3Client.connect(("127.0.0.1", port))
            cb = await V3Client.connect((b.host, b.port), session_id=ca.session_id)
            llm.push(Reply.stalled("partial ", "answer"))
            r = await ca.call(T.CHAT_TEXT, text="a long story")
            tid = r["turn_id"]
            followed = ""
            while followed != "partial answer":
                followed += (await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)).body["text"]
            proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
            killed = time.monotonic()
            end = await cb.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == tid, 30)
            assert end.type == T.TURN_END and end.body["finish_reason"] == "interrupted"
            assert time.monotonic() - killed < 5                        # not after the 60 s grace
        finally:
            for c in (ca, cb):
                if c is not None:
                    await c.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_a_turn_whose_session_another_node_took_meanwhile_is_told_so_and_each_client_sees_one_end(
        tmp_path, url):
    agent = EchoAgent()
    async with node(tmp_path, url, "a", agent=agent) as a, node(tmp_path, url, "b") as b:
        ca = await V3Client.connect((a.host, a.port))
        cb = None
        probe = await asyncpg.connect(url)
        try:
            sid = await _session_off_line_0(ca)
            cb = await V3Client.connect((b.host, b.port), session_id=sid)
            r = await ca.call(T.CHAT_TEXT, text="!block a long answer")
            tid, asked = r["turn_id"], r["user_message"]["id"]
            await agent.wait_blocked()
            await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)
            queued = await cb.call(T.CHAT_TEXT, text="from b")            # waits in PostgreSQL's queue
            assert queued["queued"] == 1
            key = key_of("session", sid)
            pid = await probe.fetchval(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND classid::bigint = ($1::bigint >> 32) & 4294967295 "
                "AND objid::bigint = $1::bigint & 4294967295", key)
            assert pid is not None

            # node A's connection holding the session's lock breaks: node B's waiting turn is granted
            # the lock at once, closes node A's turn as interrupted and runs; node A cannot take it back
            assert await probe.fetchval("SELECT pg_terminate_backend($1)", pid)
            mine = await cb.turn_events(queued["turn_id"], timeout=30)
            assert answer_text(mine) == "echo: from b"
            assert not await a.services.cluster.turn_lock.still_held(sid, asked)   # its answer must not go in
            assert _ends(ca, tid) == []          # node B's closing TURN_END is not shown on node A

            agent.release()
            a_end = await ca.wait_for(lambda m: m.type in ENDS and m.body.get("turn_id") == tid, 30)
            assert a_end.body.get("finish_reason") != "interrupted"   # node A's own end of its turn
            r2 = await ca.call(T.CHAT_TEXT, text="after")              # (later than anything of the turn)
            await ca.turn_events(r2["turn_id"], timeout=30)
            await cb.turn_events(r2["turn_id"], timeout=30)
            b_ends = [m for m in cb.inbox if m.type in ENDS and m.body.get("turn_id") == tid]
            assert [(m.type, m.body.get("finish_reason")) for m in b_ends] == [(T.TURN_END, "interrupted")]
            assert _ends(ca, tid) == []          # one end a turn on each node
            assert b.services.cluster.interrupted == 1
        finally:
            for c in (ca, cb):
                if c is not None:
                    await c.close()
            await probe.close()

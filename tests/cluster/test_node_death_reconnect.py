"""A node's connections break (PostgreSQL restarted, or every backend terminated), then the node is
SIGKILLed mid-turn: the other node still closes its turn as interrupted, once the grace it gives a
node after its own connection broke (``reconnect_grace_ms``) is over. The dying node must take its
liveness lock again as soon as it can (not when a session on that holder connection is next claimed),
and a watcher must not take a node that is reconnecting for dead."""
from __future__ import annotations

import asyncio
import signal

import asyncpg

from protocol import MsgType as T
from storage.pg.lock_holder import key_of
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client, poll

from cluster.conftest import node
from cluster.test_node_death import start_node_process

LINES = 4          # pg_lock_connections' default: line 0 also holds the node's liveness lock
GRACE_S = 1.0      # node B's reconnect_grace_ms


async def _break_every_connection(url: str) -> None:
    """What a PostgreSQL restart does to the nodes: every backend of the database is ended."""
    con = await asyncpg.connect(url)
    try:
        await con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    finally:
        await con.close()


async def test_a_node_killed_after_its_connections_broke_still_has_its_turn_closed(tmp_path, pg_url):
    async with ScriptedLLM() as llm, \
            node(tmp_path, pg_url, "survivor", sections={"cluster": {"reconnect_grace_ms": GRACE_S * 1000}}) as b:
        proc, port = await start_node_process(tmp_path, pg_url, {"NPLT_LLM_BASE_URL": llm.base_url})
        ca = cb = None
        try:
            ca = await V3Client.connect(("127.0.0.1", port))
            sid = ca.session_id
            while key_of("session", sid) % LINES == 0:      # a session whose lock is not on line 0
                sid = (await ca.call(T.SESSION_NEW, title="not on line 0"))["session"]["session_id"]
            await ca.call(T.SESSION_SWITCH, session_id=sid)
            cb = await V3Client.connect((b.host, b.port), session_id=sid)

            llm.push(Reply.text("warm ", "up"))             # node B starts watching node A
            r = await ca.call(T.CHAT_TEXT, text="warm up")
            assert (await cb.turn_events(r["turn_id"], timeout=30))[-1].type == T.TURN_END
            listener = b.services.cluster.relay.listener
            connects = listener.connects

            await _break_every_connection(pg_url)
            await poll(lambda: listener.connects > connects and listener.connected.is_set(), 30,
                       "node B listening again")

            llm.push(Reply.stalled("partial ", "answer"))
            r = await ca.call(T.CHAT_TEXT, text="a long story")
            tid = r["turn_id"]
            followed = ""
            while followed != "partial answer":             # node B follows node A's turn
                followed += (await cb.wait_type(T.ANSWER_DELTA, timeout=30, turn_id=tid)).body["text"]

            proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
            end = await cb.wait_for(lambda m: m.type in (T.TURN_END, T.TURN_ERROR)
                                    and m.body.get("turn_id") == tid, GRACE_S + 10)
            assert end.type == T.TURN_END and end.body["finish_reason"] == "interrupted"
            assert end.body["message"]["metadata"]["answers"] == r["user_message"]["id"]
            assert sid not in b.services.cluster.remote_turns
            info = await cb.call(T.SESSION_INFO, session_id=sid)
            assert info["session"]["running"] is False
        finally:
            for c in (ca, cb):
                if c is not None:
                    await c.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()

"""The server on the PostgreSQL backend, over real TCP: turns are stored and read back, a stopped
PostgreSQL reaches the client as STORAGE_UNAVAILABLE, and the node recovers by itself."""
from __future__ import annotations

import pytest

from pg.dbs import fresh_database
from protocol import MsgType as T
from storage import StorageConfig
from storage.port import open_store
from server.app import Server
from testkit.echo_agent import EchoAgent
from testkit.server import ReplyError, V3Client, answer_text, make_config, poll


@pytest.mark.parametrize("memory", ["basic", "auto"])
async def test_turns_on_postgres_and_recovery_after_a_restart(tmp_path, own_server, memory):
    url = await fresh_database(own_server)
    store = await open_store(StorageConfig(url=url, pg_retry_attempts=1, pg_retry_backoff_ms=10))
    srv = Server(make_config(tmp_path), agent=EchoAgent(), store=store,
                 memory=None if memory == "auto" else memory)
    host, port = await srv.start()
    try:
        c = await V3Client.connect((host, port))
        r = await c.call(T.CHAT_TEXT, text="hello postgres")
        assert answer_text(await c.turn_events(r["turn_id"])) == "echo: hello postgres"
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["content"] for m in page["messages"]] == ["hello postgres", "echo: hello postgres"]
        assert (await store.get(c.session_id)).message_count == 2

        own_server.stop()
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_REQUEST)
        assert err.value.code == "STORAGE_UNAVAILABLE"
        own_server.start()

        async def served() -> bool:
            try:
                await c.call(T.HISTORY_REQUEST)
                return True
            except ReplyError as exc:
                assert exc.code == "STORAGE_UNAVAILABLE"
                return False
        await poll(served, timeout=30)
        r = await c.call(T.CHAT_TEXT, text="again")
        assert answer_text(await c.turn_events(r["turn_id"])) == "echo: again"
        page = await c.call(T.HISTORY_REQUEST)
        assert [m["content"] for m in page["messages"]][-2:] == ["again", "echo: again"]
        await c.close()
    finally:
        await srv.stop()
        await store.close()


async def test_a_chat_message_to_a_session_not_ones_own_is_not_found_and_claims_nothing(tmp_path, pg_url):
    """On PostgreSQL the turn's claim checks the session (``nplt_claim_owned``): another user's
    session, a deleted one, an unknown or malformed id are NOT_FOUND, nothing is stored and the
    session's lock is left free; the owner's turns run as before."""
    users = [("alice", "token-a"), ("bob", "token-b")]
    srv = Server(make_config(tmp_path, users=users, storage={"url": pg_url}), agent=EchoAgent())
    host, port = await srv.start()
    try:
        alice = await V3Client.connect((host, port), token="token-a")
        bob = await V3Client.connect((host, port), token="token-b")
        r = await alice.call(T.CHAT_TEXT, text="mine")
        assert answer_text(await alice.turn_events(r["turn_id"])) == "echo: mine"
        sid = alice.session_id
        trash = (await alice.call(T.SESSION_NEW, title="to delete"))["session"]["session_id"]
        await alice.call(T.SESSION_DELETE, session_id=trash)
        for client, target in ((bob, sid), (alice, trash), (bob, "s_20260101_000000000000"), (bob, "x; --")):
            with pytest.raises(ReplyError) as err:
                await client.call(T.CHAT_TEXT, text="not yours", session_id=target)
            assert err.value.code == "NOT_FOUND", target
        assert not srv.runner.lanes and not srv.services.cluster.holder.held
        assert (await srv.store.get(sid)).message_count == 2
        assert (await srv.store.get(trash)).message_count == 0
        r = await alice.call(T.CHAT_TEXT, text="still mine", session_id=sid)
        assert answer_text(await alice.turn_events(r["turn_id"])) == "echo: still mine"
        await alice.close()
        await bob.close()
    finally:
        await srv.stop()

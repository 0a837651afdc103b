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

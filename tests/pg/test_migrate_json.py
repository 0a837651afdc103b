"""migrate-json-to-pg: a JSON store copied whole into PostgreSQL reads back the same through the
port, counts are verified, a rerun copies nothing, a damaged copy is reported."""
from __future__ import annotations

import asyncio

import asyncpg

from storage import AsyncHistoryStore, StorageConfig, SummaryRecord, ToolCall
from storage.pg.migrate import main, migrate_json_to_pg
from storage.port import open_store


async def _fill_json(root: str) -> list[str]:
    js = await AsyncHistoryStore.open(StorageConfig(root=root))
    try:
        a = await js.create("alice", "Plain", model="m")
        await js.append(a.session_id, "user", "hello \x00 世界", metadata={"k": 1})
        await js.append(a.session_id, "assistant", "answer",
                        tool_calls=[ToolCall("c1", "ls", {"p": "/"}, "etc", duration=0.5)])
        await js.add_summary(a.session_id, SummaryRecord("sum", 1, 2, model="s"))
        b = await js.create("alice", "Cleared")
        for i in range(5):
            await js.append(b.session_id, "user", f"old {i}")
        await js.clear(b.session_id)
        await js.append(b.session_id, "user", "new")
        c = await js.create("bob", "Deleted")
        await js.append(c.session_id, "user", "gone")
        await js.delete(c.session_id)
        await js.create("bob", "Empty")
        return [a.session_id, b.session_id, c.session_id]
    finally:
        await js.close()


async def test_copy_reads_back_the_same_and_reruns_are_safe(tmp_path, pg_url):
    root = str(tmp_path / "history")
    ids = await _fill_json(root)
    report = await migrate_json_to_pg(root, pg_url)
    assert report.ok, report.mismatches
    assert (report.sessions, report.copied, report.already, report.messages) == (4, 4, 0, 9)

    js = await AsyncHistoryStore.open(StorageConfig(root=root))
    pg = await open_store(StorageConfig(url=pg_url))
    try:
        for user in ("alice", "bob"):
            assert await pg.list(user) == await js.list(user)
        for sid in ids:
            assert await pg.get(sid) == await js.get(sid)
            assert await pg.messages(sid) == await js.messages(sid)
            assert await pg.page(sid, limit=2) == await js.page(sid, limit=2)
        assert await pg.search("alice", "hello") == await js.search("alice", "hello")
        # cleared messages and the deleted session came along
        for store in (js, pg):
            await store.restore(ids[1])
            await store.restore(ids[2])
        assert [m.content for m in await pg.messages(ids[1])] == [m.content for m in await js.messages(ids[1])]
        assert (await pg.get(ids[1])).message_count == 6 and not (await pg.get(ids[2])).deleted
        assert (await pg.append(ids[1], "user", "next")).id == 7
    finally:
        await js.close()
        await pg.close()


async def test_rerun_and_damage_detection_through_the_command(tmp_path, pg_url, capsys):
    root = str(tmp_path / "history")
    ids = await _fill_json(root)
    assert await asyncio.to_thread(main, ["--data-dir", root, "--storage-url", pg_url]) == 0
    assert "verified: counts match" in capsys.readouterr().out
    con = await asyncpg.connect(pg_url)
    try:
        await con.execute("DELETE FROM nplt_messages WHERE session_id = $1 AND id = 1", ids[0])
    finally:
        await con.close()
    report = await migrate_json_to_pg(root, pg_url)
    assert (report.copied, report.already) == (0, 4)
    assert not report.ok and ids[0] in report.mismatches[0]
    assert await asyncio.to_thread(main, ["--data-dir", str(tmp_path / "nope"), "--storage-url", pg_url]) == 1
    assert "not a directory" in capsys.readouterr().err

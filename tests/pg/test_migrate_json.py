"""migrate-json-to-pg: a JSON store copied whole into PostgreSQL reads back the same through the
port, counts are verified, a rerun copies nothing, a damaged copy is reported; the user memory files
come along."""
from __future__ import annotations

import asyncio

import asyncpg

from storage import AsyncHistoryStore, StorageConfig, SummaryRecord, ToolCall
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import DocUserMemoryStore, MemoryItem
from server.memory.user_store_pg import PgUserDocs
from server.migrate import main
from storage.pg.link import PgLink
from storage.pg.migrate import migrate_json_to_pg
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


async def test_user_memory_files_are_copied_verified_and_read_back(tmp_path, pg_url, capsys):
    root = tmp_path / "history"
    await _fill_json(str(root))
    files = JsonUserMemoryStore(root / "user_memory")        # where the server keeps them by default
    fact = MemoryItem("m1", "fact", "The prod DB host is db-prod-42.", "s1", 1, "2026-11-26T10:00:00+00:00")
    pref = MemoryItem("m2", "preference", "Answer in Chinese.", "s1", 1, "2026-11-26T10:00:00+00:00")
    await files.add("alice", [fact, pref], learned=("s1", 1))
    await files.forget("alice", "m2")
    await files.add("bob", [MemoryItem("m3", "fact", "bob's host is h-3", "s2", 4, "x")])
    (root / "user_memory" / "junk.json").write_text("{not json")
    assert await asyncio.to_thread(main, ["--data-dir", str(root), "--storage-url", pg_url]) == 1
    out = capsys.readouterr()
    assert "user memory of 2 users: 2 copied, 0 already in PostgreSQL" in out.out
    assert "junk.json: unreadable user memory file" in out.err          # reported, the rest copied
    (root / "user_memory" / "junk.json").unlink()
    assert await asyncio.to_thread(main, ["--data-dir", str(root), "--storage-url", pg_url]) == 0
    out = capsys.readouterr().out
    assert "user memory of 2 users: 0 copied, 2 already" in out and "verified: counts match" in out
    link = PgLink(StorageConfig(url=pg_url))
    await link.open()
    pg = DocUserMemoryStore(PgUserDocs(link))
    try:
        assert await pg.list("alice") == [fact] and await pg.learned("alice", "s1") == 1
        assert await pg.add("alice", [pref]) == []                       # its tombstone came along
        assert [i.id for i in await pg.list("bob")] == ["m3"]
    finally:
        await pg.close()
        await link.close()

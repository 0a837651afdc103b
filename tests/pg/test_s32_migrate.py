"""Review s32: migrate-json-to-pg does not report "verified" while a session stays behind, and a
database already in use gives notes, not mismatches no rerun can resolve.

- A damaged snapshot (the JSON store moves it to quarantine/ when it opens) is a MISMATCH, exit 1,
  and the session count says 3 sessions, 1 not copied; a rerun (the files are in quarantine/ now)
  still says so, until the files are moved out of quarantine/. A journal with an unreadable line
  (copied to quarantine/, the session copied without it) is a NOTE.
- A user who has a memory row in PostgreSQL already keeps it: a NOTE (how many of the file's items
  were not copied), exit 0, on every run.
- Documents copied over the target's ``user_quota_bytes`` / ``max_documents_per_collection`` (read
  from ``--config``) are NOTEs: kept, exit 0.
"""
from __future__ import annotations

import asyncio
import json
import os

import asyncpg

from client import kb as kbclient
from client.connection import Client
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import MemoryItem, UserDoc
from server.migrate import main
from storage import AsyncHistoryStore, StorageConfig
from storage.ids import journal_name, snapshot_name
from storage.port import open_store
from testkit.server import running_server

from kb_wire.kbwire import auth_section, token


async def _migrate(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def _sessions(root: str, n: int) -> list[str]:
    js = await AsyncHistoryStore.open(StorageConfig(root=root))
    try:
        ids = []
        for i in range(n):
            s = await js.create("alice", f"S{i}")
            await js.append(s.session_id, "user", f"hello {i}")
            ids.append(s.session_id)
        return ids
    finally:
        await js.close()


async def test_a_damaged_session_is_a_mismatch_on_every_run_until_its_files_are_dealt_with(tmp_path, pg_url, capsys):
    root = str(tmp_path / "history")
    ok1, ok2, bad = await _sessions(root, 3)
    with open(os.path.join(root, snapshot_name(bad)), "wb") as f:
        f.write(b"{not json")                                   # damaged: quarantined when the store opens
    with open(os.path.join(root, journal_name(ok2)), "ab") as f:
        f.write(b"garbage line\n")                              # an unreadable journal line

    code, out, err = await _migrate(capsys, "--data-dir", root, "--storage-url", pg_url)
    assert code == 1, out + err
    assert "3 sessions: 2 copied (2 messages), 0 already in PostgreSQL, 1 not copied" in out
    assert f"MISMATCH session {bad}: damaged, moved to {root}/quarantine/ by the JSON store" in err
    assert "verified: counts match" not in out and "1 mismatches" in out
    assert f"NOTE session {ok2}: the JSON store set files of it aside in quarantine/" in out
    moved = sorted(os.listdir(os.path.join(root, "quarantine")))
    assert any(n.startswith(snapshot_name(bad) + ".") for n in moved)

    code, out, err = await _migrate(capsys, "--data-dir", root, "--storage-url", pg_url)
    assert code == 1, out + err                                  # a rerun does not forget it
    assert "3 sessions: 0 copied (0 messages), 2 already in PostgreSQL, 1 not copied" in out
    assert f"MISMATCH session {bad}: set aside earlier as damaged" in err
    assert f"session {ok2}" not in out + err                     # (its journal copy is old news)

    aside = tmp_path / "set-aside"
    os.replace(os.path.join(root, "quarantine"), aside)          # the operator leaves it behind
    code, out, err = await _migrate(capsys, "--data-dir", root, "--storage-url", pg_url)
    assert code == 0, out + err
    assert "2 sessions: 0 copied (0 messages), 2 already in PostgreSQL\n" in out
    assert "verified: counts match" in out
    con = await asyncpg.connect(pg_url)
    try:
        got = {r["session_id"] for r in await con.fetch("SELECT session_id FROM nplt_sessions")}
    finally:
        await con.close()
    assert got == {ok1, ok2}


async def test_a_journal_without_its_snapshot_is_a_mismatch(tmp_path, pg_url, capsys):
    root = str(tmp_path / "history")
    ok, gone = await _sessions(root, 2)
    os.unlink(os.path.join(root, snapshot_name(gone)))
    with open(os.path.join(root, journal_name(gone)), "ab") as f:
        f.write(b'{"seq":7,"op":"append"}\n')                  # a journal holding data, no snapshot
    code, out, err = await _migrate(capsys, "--data-dir", root, "--storage-url", pg_url)
    assert code == 1, out + err
    assert "2 sessions: 1 copied (1 messages), 0 already in PostgreSQL, 1 not copied" in out
    assert f"MISMATCH session {gone}: a journal without a snapshot" in err
    code, out, err = await _migrate(capsys, "--data-dir", root, "--storage-url", pg_url)
    assert code == 0, out + err                                  # only a journal in quarantine/: a note
    assert f"NOTE session {gone}: only a journal of it is in" in out and "verified: counts match" in out


async def test_a_user_memory_row_already_in_the_database_is_kept_with_a_note(tmp_path, pg_url, capsys):
    root = tmp_path / "history"
    await _sessions(str(root), 1)
    files = JsonUserMemoryStore(root / "user_memory")
    await files.add("alice", [MemoryItem("m1", "fact", "The prod DB host is db-prod-42.", "s1", 1, "x")])
    await files.add("bob", [MemoryItem("m3", "fact", "bob's host is h-3", "s2", 4, "x")])
    # the database is in use: alice has a row of her own there already
    await (await open_store(StorageConfig(url=pg_url))).close()          # (the schema)
    con = await asyncpg.connect(pg_url)
    try:
        mine = UserDoc([MemoryItem("p1", "fact", "my printer is on floor 3", "s9", 1, "y")]).to_json("alice")
        await con.execute("INSERT INTO nplt_user_memory (user_id, doc, version) VALUES ($1, $2::jsonb, 1)",
                          "alice", json.dumps(mine))
        for _ in range(2):                                       # the same on every run
            code, out, err = await _migrate(capsys, "--data-dir", str(root), "--storage-url", pg_url)
            assert code == 0, out + err
            assert "MISMATCH" not in err and "verified: counts match" in out
            assert ("NOTE user memory of 'alice': PostgreSQL held a row already (1 items), kept as it is; "
                    "1 of the file's 1 items are not in it and were not copied") in out
        row = await con.fetchval("SELECT doc FROM nplt_user_memory WHERE user_id = 'alice'")
        assert [i["id"] for i in json.loads(row)["items"]] == ["p1"]           # kept
        row = await con.fetchval("SELECT doc FROM nplt_user_memory WHERE user_id = 'bob'")
        assert [i["id"] for i in json.loads(row)["items"]] == ["m3"]           # copied
        # bob's row changes after the copy (a server on PostgreSQL used it): a note on a rerun too
        await con.execute("UPDATE nplt_user_memory SET doc = jsonb_set(doc, '{items}', '[]'::jsonb) "
                          "WHERE user_id = 'bob'")
    finally:
        await con.close()
    code, out, err = await _migrate(capsys, "--data-dir", str(root), "--storage-url", pg_url)
    assert code == 0 and "NOTE user memory of 'bob': PostgreSQL held a row already (0 items)" in out


async def test_copied_documents_over_the_targets_quotas_are_noted(tmp_path, pg_url, capsys):
    docs = {"a.md": b"# A\n\nThe restore timeout is 30 minutes.\n" * 20,
            "b.md": b"# B\n\nThe backup runs nightly at 2am.\n" * 20}
    for name, body in docs.items():
        (tmp_path / name).write_bytes(body)
    async with running_server(tmp_path / "json", sections={"auth": auth_section()}) as (_srv, addr):
        async with Client(*addr, token=token("alice")) as c:
            for name in docs:
                await kbclient.upload(c, tmp_path / name)
    root = tmp_path / "json" / "history"
    total = sum(len(b) for b in docs.values())
    config = tmp_path / "target.toml"
    config.write_text(f"[knowledge]\nuser_quota_bytes = {total - 1}\nmax_documents_per_collection = 1\n")
    code, out, err = await _migrate(capsys, "--data-dir", str(root), "--storage-url", pg_url, "--config", str(config))
    assert code == 0, out + err
    assert f"knowledge base: 2 documents: 2 copied ({total} bytes)" in out
    assert (f"NOTE knowledge base: 'alice' has {total} bytes of documents in PostgreSQL, over "
            f"user_quota_bytes = {total - 1}") in out
    assert "holds 2 documents in PostgreSQL, over max_documents_per_collection = 1" in out
    code, out, _ = await _migrate(capsys, "--data-dir", str(root), "--storage-url", pg_url)
    assert code == 0 and "NOTE knowledge base" not in out        # the defaults: within them
    config.write_text("[knowledge]\nuser_quota_bytes = -1\n")
    code, _, err = await _migrate(capsys, "--data-dir", str(root), "--storage-url", pg_url, "--config", str(config))
    assert code == 2 and "configuration error: knowledge.user_quota_bytes" in err

"""A real server whose data directory holds a session journal replaced by a symbolic link to a file
outside it: the session is refused (ERROR line, files moved to quarantine/, NOT_FOUND to clients),
the file outside is never written, cut or truncated, and every other session keeps being served."""
from __future__ import annotations

import json

import pytest

from protocol import MsgType as T
from storage.ids import journal_name
from testkit.process import ServerProcess
from testkit.server import ReplyError, V3Client

OUTSIDE = b"line one of an unrelated file\nline two\nthird line without newline"


async def turn(c: V3Client, sid: str, text: str) -> None:
    r = await c.call(T.CHAT_TEXT, session_id=sid, text=text)
    assert (await c.turn_events(r["turn_id"], timeout=30))[-1].type == T.TURN_END


async def test_a_linked_journal_is_refused_and_the_server_keeps_serving(tmp_path) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside.txt"
    srv = await ServerProcess.start(data)
    try:
        c = await V3Client.connect(srv.addr)
        victim = c.session_id
        await turn(c, victim, "first")
        other = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        await turn(c, other, "kept")
        await c.close()
    finally:
        assert await srv.stop() == 0
    outside.write_bytes(OUTSIDE)
    journal = data / journal_name(victim)
    journal.unlink()
    journal.symlink_to(outside)

    srv = await ServerProcess.start(data)
    try:
        c = await V3Client.connect(srv.addr, session_id=victim, new_session=False)
        assert (c.hello.get("session") or {}).get("session_id") != victim
        with pytest.raises(ReplyError) as ei:
            await c.call(T.HISTORY_REQUEST, session_id=victim)
        assert ei.value.code == "NOT_FOUND"
        await turn(c, other, "still served")
        page = await c.call(T.HISTORY_REQUEST, session_id=other)
        assert [m["content"] for m in page["messages"] if m["role"] == "user"] == ["kept", "still served"]
        await c.close()
    finally:
        assert await srv.stop() == 0
    assert outside.read_bytes() == OUTSIDE
    [aside] = (data / "quarantine").glob(journal_name(victim) + ".*")
    assert aside.is_symlink() and not journal.exists()
    errors = [json.loads(line)["msg"] for line in srv.log_path.read_text().splitlines()
              if line.startswith("{") and json.loads(line)["level"] == "error"]
    assert any(f"session {victim} refused" in m and "symbolic link" in m for m in errors)

"""An acknowledged fact whose memory write fails (a disk that refuses it: EFBIG) is not claimed as
noted, says why it was not stored, raises a NOTICE STORAGE_ERROR, and is stored by a later turn once
the disk takes writes again (before: "Noted: ..." with only an ERROR in the log, and the message was
marked distilled, so the fact was never stored). A real server process over loopback; the disk's
refusal is RLIMIT_FSIZE set on the running process (``resource.prlimit``), lifted afterwards."""
from __future__ import annotations

import hashlib
import json
import resource
from pathlib import Path

from protocol import MsgType as T
from server.memory.user_store import MemoryItem, UserDoc
from testkit.process import ServerProcess
from testkit.server import V3Client, poll

#: the user memory file is rewritten over this many bytes: refused; history appends stay under it
FSIZE = 30_000
USER = "local"                          # single-user mode


def seed_memory(data: Path, n: int = 150) -> Path:
    """A user memory file of ``n`` facts, bigger than FSIZE, so its rewrite is refused."""
    root = data / "user_memory"
    root.mkdir(parents=True)
    items = [MemoryItem(f"m{i:012x}", "fact", f"The host of service number {i} is server-{i}-abcdefghijklmnop.internal",
                        "s_20250101_000000000000", i + 1, "2025-01-01T00:00:00+00:00") for i in range(n)]
    path = root / (hashlib.sha256(USER.encode()).hexdigest()[:32] + ".json")
    path.write_text(json.dumps(UserDoc(items).to_json(USER), indent=1))
    assert path.stat().st_size > FSIZE
    return path


async def items(c: V3Client) -> list[str]:
    return [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]


async def test_a_fact_the_disk_refuses_is_not_noted_and_is_stored_later(tmp_path):
    data = tmp_path / "data"
    seed_memory(data)
    srv = await ServerProcess.start(data)
    try:
        hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (FSIZE, hard))
        c = await V3Client.connect(srv.addr)
        sid = c.session_id
        r = await c.call(T.CHAT_TEXT, text="remember that the backup host is bk-99.internal")
        events = await c.turn_events(r["turn_id"], timeout=30)
        end = events[-1]
        assert end.type == T.TURN_END, end.body
        content = end.body["message"]["content"]
        assert not content.startswith("Noted"), content
        assert "could not save" in content and "storage failed" in content and "File too large" in content, content
        assert "bk-99.internal" in content                    # what was not saved is named
        assert end.body["message"]["metadata"]["memory_error"].startswith("the server's storage failed")
        notice = await c.wait_type(T.NOTICE, timeout=30, code="STORAGE_ERROR")
        assert notice.body["level"] == "warning" and "could not save" in notice.body["message"]
        assert notice.body["session_id"] == sid
        assert not any("bk-99" in t for t in await items(c))
        page = await c.call(T.HISTORY_REQUEST, session_id=sid)
        stored = page["messages"][-1]["content"]
        assert stored == content and not stored.startswith("Noted")

        # the disk takes writes again: the next turn of the session stores the fact
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, hard))
        r = await c.call(T.CHAT_TEXT, text="thanks")
        assert (await c.turn_events(r["turn_id"], timeout=30))[-1].type == T.TURN_END

        async def stored_now() -> bool:
            return any("backup host is bk-99.internal" in t for t in await items(c))
        await poll(stored_now, timeout=30, what="the fact stored after the disk recovered")
        # and an acknowledgement that is stored says so, as before
        r = await c.call(T.CHAT_TEXT, text="remember that the build host is build-7.internal")
        end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
        assert end.body["message"]["content"].startswith("Noted:"), end.body
        assert "memory_error" not in end.body["message"]["metadata"]
        assert any("build host is build-7.internal" in t for t in await items(c))   # before TURN_END
        await c.close()
    finally:
        assert await srv.stop() == 0
    log = srv.log_path.read_text()
    assert "File too large" in log

"""``nplt-client memory list [--json]`` and ``memory forget ID`` against a real server with the real
memory layer."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from client.main import main
from client_testlib import ServerThread


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    host, port = st.addr
    code = main(["--host", host, "--port", str(port), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_memory_list_and_forget(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path, memory="auto") as st:
        code, out, err = run(st, capsys, "memory", "list", "--json")
        assert code == 0 and json.loads(out) == {"enabled": True, "items": [], "truncated": False}
        code, _, err = run(st, capsys, "ask", "The prod DB host is db-prod-42. 以后请用中文回答。")
        assert code == 0, err
        um = st.srv.services.memory.user_memory
        deadline = time.monotonic() + 10          # learning runs in the background after the turn
        while len(st.run(um.list("local"))) < 2:
            assert time.monotonic() < deadline, "nothing learned"
            st.run(st.srv.services.memory.wait_idle())
        code, out, err = run(st, capsys, "memory", "list", "--json")
        doc = json.loads(out)
        assert code == 0 and [(i["kind"], i["text"]) for i in doc["items"]] == [
            ("fact", "The prod DB host is db-prod-42."), ("preference", "以后请用中文回答。")]
        first = doc["items"][0]["id"]
        code, out, _ = run(st, capsys, "memory", "list")
        lines = out.splitlines()
        assert len(lines) == 2 and lines[0].startswith(f"{first}  fact") and lines[0].endswith("db-prod-42.")
        code, out, _ = run(st, capsys, "memory", "forget", first)
        assert code == 0 and out == f"forgot {first}\n"
        code, out, err = run(st, capsys, "memory", "forget", first)
        assert code == 5 and out == "" and err.startswith("nplt-client: NOT_FOUND: ")
        code, out, _ = run(st, capsys, "memory", "list", "--json")
        assert [i["text"] for i in json.loads(out)["items"]] == ["以后请用中文回答。"]


def test_memory_off_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:                   # BasicMemory: no long-term memory
        code, out, _ = run(st, capsys, "memory", "list")
        assert code == 0 and out == "long-term memory is turned off on this server\n"
        code, _, err = run(st, capsys, "memory", "forget", "m1")
        assert code == 5 and "UNSUPPORTED" in err
        with pytest.raises(SystemExit) as exc:
            run(st, capsys, "memory")
        assert exc.value.code == 2


def test_memory_list_says_when_the_reply_held_only_the_newest_items(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Over the server's max_message_size the reply keeps the newest items (protocol.md §5.10): the
    text output says so on stderr and --json carries "truncated"."""
    from server.memory.user_store import MemoryItem
    with ServerThread(tmp_path, memory="auto", max_message_size=65535,
                      sections={"user_memory": {"max_items": 1000}}) as st:
        items = [MemoryItem(f"m{n:03d}", "fact", f"The host number {n} of the fleet is host-{n:04d}.example.net.",
                            "s_20261122_000000000000", n + 1, f"2026-11-22T{n // 3600:02d}:{n // 60 % 60:02d}:"
                            f"{n % 60:02d}+00:00") for n in range(600)]
        st.run(st.srv.services.memory.user_memory.store.add("local", items))
        code, out, err = run(st, capsys, "memory", "list", "--json")
        body = json.loads(out)
        assert code == 0 and body["truncated"] is True and 0 < len(body["items"]) < 600
        assert body["items"][-1]["id"] == "m599"
        code, out, err = run(st, capsys, "memory", "list")
        shown = len(out.strip().splitlines())
        assert code == 0 and err == f"nplt-client: only the {shown} newest items fit in the server's reply\n"

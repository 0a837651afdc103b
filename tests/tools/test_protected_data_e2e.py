"""End to end: a real server whose ``[tools] file_roots`` holds its own data directory.

Bob asks the offline agent (production wiring, real loopback TCP) to list, grep and read the parent of
the data directory and the directory itself: he sees the public files of the root and nothing of
alice's conversation, her long-term memory or her knowledge-base document, all of which are on disk
under that root (checked first, so the test shows the exposure it closes).
"""
from __future__ import annotations

from pathlib import Path

import orjson

from protocol import MsgType
from server.app import Server
from testkit.server import V3Client, answer_text, make_config, poll

T = MsgType
TURN_DEADLINE = 30.0
PHRASE = "purple-elephant-42"
SALARY = "zebra-salary-123456"
REFUSED = "is part of the server's own data"


def files_holding(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


async def chat(client: V3Client, text: str) -> tuple[str, list[dict]]:
    """One turn: (the answer, the finished tool calls)."""
    reply = await client.call(T.CHAT_TEXT, id=client.next_id(), text=text)
    events = await client.turn_events(reply["turn_id"], timeout=TURN_DEADLINE)
    assert events[-1].type == T.TURN_END, events[-1].body
    answer = answer_text(events)
    assert answer == events[-1].body["message"]["content"] and answer
    return answer, [ev.body["call"] for ev in events if ev.type == T.TOOL_RESULT]


async def test_bob_cannot_read_alices_data_through_the_file_tools(tmp_path):
    (tmp_path / "public").mkdir()
    (tmp_path / "public" / "notice.txt").write_text("purple-elephant is the team mascot\n")
    data = tmp_path / "history"                       # storage.root, inside the file root
    cfg = make_config(tmp_path, users=[("alice", "token-alice"), ("bob", "token-bob")],
                      sections={"llm": {}, "tools": {"file_roots": [str(tmp_path)]}})
    assert Path(cfg.storage.root) == data
    srv = Server(cfg)                                 # the production wiring: offline agent, real memory
    addr = await srv.start()
    try:
        alice = await V3Client.connect(addr, token="token-alice")
        answer, _ = await chat(alice, f"remember that the vault unlock phrase is {PHRASE}")
        assert PHRASE in answer
        await srv.services.knowledge.ingest("alice", [], None, "alice-private.md",
                                            f"# Private\n\nalice salary is {SALARY}\n".encode())
        # alice's secrets are on disk under the file root: journal, user memory, knowledge base
        await poll(lambda: len({p.relative_to(data).parts[0] for p in files_holding(data, PHRASE)}) >= 2,
                   what="alice's phrase in her session files and her user memory")
        assert files_holding(data / "user_memory", PHRASE)
        assert files_holding(data / "knowledge", SALARY)
        await alice.close()

        bob = await V3Client.connect(addr, token="token-bob")
        seen: list[str] = []

        answer, [call] = await chat(bob, f"列出 {tmp_path} 目录下的文件")
        assert call["tool_name"] == "list_dir" and call["status"] == "success", call
        listed = orjson.loads(call["result"])
        assert [e["name"] for e in listed["entries"]] == ["public"] and "hidden" not in listed
        seen += [answer, call["result"]]

        answer, [call] = await chat(bob, f"grep purple-elephant in {tmp_path}")
        assert call["tool_name"] == "search_files" and call["status"] == "success", call
        found = orjson.loads(call["result"])
        assert [m["path"] for m in found["matches"]] == ["public/notice.txt"]   # the root is really searched
        seen += [answer, call["result"]]

        answer, [call] = await chat(bob, f"grep {SALARY} in {tmp_path}")   # (the answer repeats the pattern)
        assert call["status"] == "success" and orjson.loads(call["result"])["matches"] == []
        assert orjson.loads(call["result"])["files_searched"] == 1

        for text, tool in [(f"列出 {data} 目录下的文件", "list_dir"),
                           (f"列出 {data / 'user_memory'} 目录下的文件", "list_dir"),
                           (f"grep vault in {data}", "search_files"),
                           (f"grep salary in {data / 'knowledge'}", "search_files"),
                           (f"查看 {files_holding(data / 'user_memory', PHRASE)[0]} 的内容", "read_file"),
                           (f"查看 {data / 'index.json'} 的内容", "read_file")]:
            answer, [call] = await chat(bob, text)
            assert call["tool_name"] == tool and call["status"] == "error", (text, call)
            assert REFUSED in orjson.loads(call["result"])["error"], (text, call)
            seen += [answer, call["result"]]

        for text in seen:
            assert PHRASE not in text and SALARY not in text and "vault unlock" not in text, text
            assert "alice-private" not in text, text
        await bob.close()
    finally:
        await srv.stop()

"""The line redactor maps what it finds to the right lines, and always ends.

``LineRedactor`` finds the lines to redact with one pass over the JSON form of all of them. It used to
split that form on '","', but a line ending in '",' encodes as '\\","' followed by the real separator,
so every such line shifted the later line numbers by one: a file such as
``{"user": "app",`` / ``"password": "hunter2hunter2"}`` made it loop forever (each read pinned a
thread at 100% CPU until the server could not stop), and search_files matched the secret's line on its
raw text, so a prefix of the password was an oracle (review: repro_hang.py, repro_oracle.py).
"""
from __future__ import annotations

import threading

import orjson
from hypothesis import given
from hypothesis import strategies as st

from protocol import MsgType
from server.app import Server
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.secrets import MASK, LineRedactor
from testkit.server import V3Client, answer_text, make_config

CTX = ToolContext("alice", "s_1")
DEADLINE = 10.0
PASSWORD = "hunter2hunter2"
DB_JSON = ['{"user": "app",', f'"password": "{PASSWORD}"}}']
APPSETTINGS = """{
  "Logging": {
    "LogLevel": {
      "Default": "Information",
      "Microsoft": "Warning"
    }
  },
  "AllowedHosts": "*",
  "Database": {
    "Host": "db-prod-42",
    "User": "app",
    "Password": "Hunter2Hunter2"
  }
}""".split("\n")


def shown_within_deadline(redactor: LineRedactor, lines: list[str]) -> list[str]:
    """``redactor.lines(lines)``, failing (not hanging) if it does not end: run in a daemon thread."""
    out: list[list[str]] = []
    worker = threading.Thread(target=lambda: out.append(redactor.lines(lines)), daemon=True)
    worker.start()
    worker.join(DEADLINE)
    assert not worker.is_alive(), f"LineRedactor.lines did not end within {DEADLINE} s"
    return out[0]


def test_a_line_ending_in_quote_comma_before_a_secret_ends_and_masks_it():
    assert shown_within_deadline(LineRedactor(), DB_JSON) == ['{"user": "app",', f'"password": "{MASK}"}}']
    shown = shown_within_deadline(LineRedactor(), APPSETTINGS)
    assert shown[11] == f'    "Password": "{MASK}"'
    assert shown[:11] + shown[12:] == APPSETTINGS[:11] + APPSETTINGS[12:]


def test_escaped_backslashes_and_quotes_do_not_shift_lines():
    lines = ['a \\",', 'b \\\\",', '"c",', '","', '\\","\\",', "token: abcd1234", 'x",', "api_key=zzzz9999", "end"]
    shown = shown_within_deadline(LineRedactor(), lines)
    assert shown == lines[:5] + [f"token: {MASK}", 'x",', f"api_key={MASK}", "end"]


# pieces of lines: JSON punctuation that used to look like a line separator, escapes, and secrets of
# both kinds (a shape, and a known value that holds a quote, a comma and a backslash)
KNOWN = 'Kv",\\9x'
PIECES = ['"', '",', '\\', '\\"', '\\\\', ',', '","', "\\n", " ", "a", "{", "}", ":", "password=", "hunter2x",
          '"token": "', "abcd1234", "Bearer ", "sk-proj-AbCdEfGhIjKlMnOpQrSt", "postgres://u:", "pw@db",
          KNOWN, "中文", "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----"]


@given(st.lists(st.lists(st.sampled_from(PIECES), max_size=6).map("".join), max_size=12),
       st.integers(min_value=1, max_value=12))
def test_changes_equal_line_by_line_redaction(lines, split):
    """Redacting many lines at once (one pass over their JSON form) changes exactly the lines that
    redacting them one at a time changes, into the same text; also when fed in two parts."""
    one_by_one = LineRedactor([KNOWN])
    expected = [one_by_one.lines([line])[0] for line in lines]
    at_once = LineRedactor([KNOWN])
    out: list[list[str]] = []
    worker = threading.Thread(target=lambda: out.append(at_once.lines(lines)), daemon=True)
    worker.start()
    worker.join(DEADLINE)
    assert not worker.is_alive(), f"LineRedactor.lines did not end on {lines!r}"
    assert out[0] == expected
    assert {i: s for i, s in enumerate(expected) if s != lines[i]} == LineRedactor([KNOWN]).changes(lines)
    parts = LineRedactor([KNOWN])
    assert parts.lines(lines[:split]) + parts.lines(lines[split:]) == expected


async def test_search_cannot_read_a_secret_after_a_line_ending_in_quote_comma(tmp_path):
    """repro_oracle.py: the line before the password ends in '",'; a search for a prefix of the
    password finds nothing, and a right guess cannot be told from a wrong one."""
    (tmp_path / "app.json").write_text(f'{{\n  "user": "app",\n  "password": "{PASSWORD}",\n  "host": "db"\n}}\n')
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)]))

    async def search(pattern: str) -> dict:
        call = await tools.run("search_files", {"root": "app.json", "pattern": pattern}, CTX)
        assert call.status == "success", call.result
        result = orjson.loads(call.result)
        result.pop("pattern")                # (the pattern is echoed back)
        assert PASSWORD not in str(result)
        return result

    for prefix in ("hunter2h", '"password": "h', PASSWORD):
        assert (await search(prefix))["matches"] == []
    assert await search('"password": "h') == await search('"password": "x')
    found = await search("password")
    assert [(m["line"], m["text"]) for m in found["matches"]] == [(3, f'  "password": "{MASK}",')]
    read = await tools.run("read_file", {"path": "app.json"}, CTX)
    assert orjson.loads(read.result)["text"].split("\n")[2] == f'  "password": "{MASK}",'


async def test_the_offline_agent_reads_such_a_file_over_the_wire(tmp_path):
    """repro_hang.py against a real server: "查看 db.json 的内容" is answered, masked, in time (the
    tool call used to time out while its thread spun on)."""
    root = tmp_path / "etc"
    root.mkdir()
    (root / "db.json").write_text("\n".join(DB_JSON) + "\n")
    cfg = make_config(tmp_path, sections={"llm": {}, "tools": {"file_roots": [str(root)], "timeout_s": 5,
                                                                "search_timeout_s": 2}})
    srv = Server(cfg)                        # the production wiring: offline agent, the real tools
    addr = await srv.start()
    try:
        client = await V3Client.connect(addr)
        for _ in range(2):
            reply = await client.call(MsgType.CHAT_TEXT, id=client.next_id(), text="查看 db.json 的内容")
            events = await client.turn_events(reply["turn_id"], timeout=30)
            assert events[-1].type == MsgType.TURN_END, events[-1].body
            [call] = [ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT]
            assert call["tool_name"] == "read_file" and call["status"] == "success", call
            assert orjson.loads(call["result"])["text"] == f'{DB_JSON[0]}\n"password": "{MASK}"}}'
            assert PASSWORD not in call["result"] and PASSWORD not in answer_text(events)
        await client.close()
    finally:
        await srv.stop()

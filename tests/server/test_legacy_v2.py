"""Legacy NPLT v2 clients speaking raw frames: never a v3 type code, answers in CHAT_TEXT."""
from __future__ import annotations

import json

from protocol import MsgType
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, running_server
from testkit.v2client import (CHAT_TEXT, CLEAR_REQUEST, CLIENT_UDP_PORT, FILE_METADATA, HISTORY_REQUEST, MODEL_SWITCH,
                              SESSION_DELETE, SESSION_LIST, SESSION_SWITCH, V2Client, welcome_session)


async def test_welcome_chat_and_heartbeat(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)  # sends CLIENT_UDP_PORT first, like the original
        assert welcome.startswith("Welcome to NPLT Assistant") and "Session: s_" in welcome
        v2.send(CHAT_TEXT, "hello there")
        thoughts, text, chunks = await v2.read_answer()
        assert text == "echo: hello there" and chunks == 3
        assert [t["type"] for t in thoughts] == ["stream_start", "thinking", "generating"]
        v2.send(CHAT_TEXT, "!tool disk")
        thoughts, text, _ = await v2.read_answer()
        assert text == "echo: !tool disk"
        tool = [t for t in thoughts if t["type"] == "tool_call"]
        assert tool and "fake_tool" in tool[0]["content"]
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        v2.send(CHAT_TEXT, "!fail badly")
        _, text, _ = await v2.read_answer()
        assert "[error LLM_ERROR]" in text
        assert v2.only_v2_codes() and v2.seq_errors == 0
        await v2.close()


async def test_silent_client_is_greeted_after_the_grace_period(tmp_path):
    async with running_server(tmp_path, legacy_grace_ms=50) as (srv, addr):
        v2, welcome = await V2Client.connect(addr, send_udp_port=False)
        assert "Session: s_" in welcome
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        await v2.close()


async def test_history_request_json(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        for i in range(3):
            v2.send(CHAT_TEXT, f"question {i}")
            await v2.read_answer()
        v2.send(HISTORY_REQUEST)
        doc = json.loads(await v2.recv_text())
        assert doc["session_id"] in welcome and doc["message_count"] == 6 and doc["has_more"] is False
        assert [m["role"] for m in doc["messages"]] == ["user", "assistant"] * 3
        assert set(doc["messages"][0]) >= {"role", "content", "timestamp", "tool_calls", "metadata"}
        v2.send(HISTORY_REQUEST, json.dumps({"limit": 2}))
        page = json.loads(await v2.recv_text())
        assert [m["content"] for m in page["messages"]] == ["question 2", "echo: question 2"]
        assert page["has_more"] is True
        v2.send(HISTORY_REQUEST, json.dumps({"before": page["next_before"], "limit": 2}))
        older = json.loads(await v2.recv_text())
        assert [m["content"] for m in older["messages"]] == ["question 1", "echo: question 1"]
        v2.send(HISTORY_REQUEST, b"{broken")
        bad = json.loads(await v2.recv_text())
        assert bad["error"]["code"] == "INVALID_MESSAGE"
        assert v2.only_v2_codes()
        await v2.close()


async def test_large_answers_and_history_fit_v2_frames(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        v2.send(CHAT_TEXT, "!big 150000")
        _, text, chunks = await v2.read_answer(timeout=30)
        assert text == "x" * 150000 and chunks == 150
        v2.send(CHAT_TEXT, "中文" * 2000)  # multi-byte text through history
        await v2.read_answer()
        v2.send(HISTORY_REQUEST)
        t, payload = await v2.recv()
        assert t == CHAT_TEXT and len(payload) <= 65535
        doc = json.loads(payload)
        assert doc["has_more"] is True and doc["messages"][-1]["content"].startswith("echo: 中文")
        v2.send(HISTORY_REQUEST, json.dumps({"before": doc["next_before"], "limit": 50}))
        t, payload = await v2.recv()
        older = json.loads(payload)
        big = [m for m in older["messages"] if m["role"] == "assistant"][-1]
        assert len(payload) <= 65535 and big["metadata"].get("truncated") is True
        assert v2.only_v2_codes()
        await v2.close()


async def test_sessions_clear_models_and_unsupported_requests(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        first = welcome_session(welcome)
        second = await v2.new_session()
        assert second.startswith("s_") and second != first
        v2.send(SESSION_LIST)
        listing = await v2.recv_text()
        assert first in listing and f"* {second}" in listing
        v2.send(SESSION_SWITCH, json.dumps({"session_id": first[:14]}))  # unambiguous prefix, JSON form
        assert (await v2.recv_text()).startswith(f"Switched to session {first}")
        v2.send(SESSION_SWITCH, second)  # bare id
        assert (await v2.recv_text()).startswith(f"Switched to session {second}")
        v2.send(SESSION_SWITCH, "s_")  # ambiguous
        assert "ambiguous" in await v2.recv_text()
        v2.send(SESSION_SWITCH, "s_19990101")
        assert "no such session" in await v2.recv_text()
        v2.send(CHAT_TEXT, "to be cleared")
        await v2.read_answer()
        v2.send(CLEAR_REQUEST)
        assert await v2.recv_text() == f"Cleared 2 messages from session {second}."
        v2.send(MODEL_SWITCH, "gpt-99")
        assert (await v2.recv_text()).startswith("Unknown model 'gpt-99'")
        v2.send(MODEL_SWITCH, json.dumps({"model": None}))      # names nothing (before: "Unknown model 'None'")
        assert (await v2.recv_text()).startswith("MODEL_SWITCH needs a model name")
        v2.send(MODEL_SWITCH, json.dumps({"model": "echo-large"}))
        assert await v2.recv_text() == f"Model switched to echo-large for session {second}."
        v2.send(SESSION_DELETE, json.dumps({"session_id": second}))
        text = await v2.recv_text()
        assert text.startswith(f"Deleted session {second}.") and f"Current session: {first}" in text
        v2.send(CLIENT_UDP_PORT, b"\x9c\x40")  # ignored
        v2.send(FILE_METADATA, b'{"name": "x"}')  # file uploads: tests/kb_v2
        assert await v2.recv_text() == "文件保存失败: field 'filename': expected a non-empty string"
        v2.send(0x55, b"unknown")  # ignored
        v2.send(MsgType.HELLO, b'{"proto": 3}')  # a v3 code on a v2 connection: ignored
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"
        v2.send(CHAT_TEXT, "   ")
        _, text, _ = await v2.read_answer()
        assert text == "Error: empty message"
        v2.send(CHAT_TEXT, b"\xff\xfe")
        _, text, _ = await v2.read_answer()
        assert text.startswith("Error:") and "UTF-8" in text
        assert v2.only_v2_codes()
        await v2.close()


async def test_v3_clients_see_a_v2_clients_turn(tmp_path):
    agent = EchoAgent()
    async with running_server(tmp_path, agent) as (srv, addr):
        v2, welcome = await V2Client.connect(addr)
        sid = welcome_session(welcome)
        v3 = await V3Client.connect(addr, session_id=sid)
        v2.send(CHAT_TEXT, "from the old client")
        _, text, _ = await v2.read_answer()
        end = await v3.wait_type(MsgType.TURN_END)
        assert end.body["re"] is None and end.body["message"]["content"] == text
        # a turn started by the v3 client is not pushed to the v2 connection
        r = await v3.call(MsgType.CHAT_TEXT, text="from the new client")
        await v3.turn_events(r["turn_id"])
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert await v2.recv_text() == "HEARTBEAT"  # nothing else arrived before
        assert v2.only_v2_codes()
        await v2.close()
        await v3.close()


async def test_fragment_frame_closes_a_v2_connection_without_a_v3_error(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        v2.send(MsgType.FRAGMENT, b"\x01part")  # v3 framing on a v2 connection: fatal, BAD_FRAGMENT
        rest = await v2.expect_eof()
        assert rest == b""  # no ERROR frame (a v3 type code) before the close
        assert v2.only_v2_codes()
        other, welcome = await V2Client.connect(addr)  # the server is fine
        assert welcome.startswith("Welcome")
        await other.close()
        await v2.close()


async def test_multibyte_text_at_an_answer_split_point(tmp_path):
    async with running_server(tmp_path, EchoAgent(chunks=1)) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        question = "ab" + "中" * 21844  # 65534 bytes; the answer "echo: ab中中..." is 65540 bytes
        v2.send(CHAT_TEXT, question)
        frames: list[bytes] = []
        while True:
            t, payload = await v2.recv()
            if t == CHAT_TEXT:
                if not payload:
                    break
                frames.append(payload)
        assert len(frames) == 2 and all(len(f) <= 65535 for f in frames)
        assert len(frames[0]) == 65534  # the 65535th byte starts a 3-byte character: cut before it
        text = "".join(f.decode("utf-8") for f in frames)  # each frame is valid UTF-8 on its own
        assert text == "echo: " + question
        assert v2.only_v2_codes()
        await v2.close()

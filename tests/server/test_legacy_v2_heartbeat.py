"""v2 heartbeats answered by the codec while the connection's request worker is idle.

``CHAT_TEXT "HEARTBEAT"`` is answered inside ``data_received`` (``Connection.receive_and_heartbeat``)
when nothing is queued or running; otherwise it waits its turn behind the requests before it (the
ordering itself is covered in test_legacy_v2_streams). A client that only sends heartbeats is a v2
client, not a silent socket: the handshake timer stops.
"""
from __future__ import annotations

import asyncio

from protocol import MsgType
from server import legacy_v2
from testkit.server import running_server
from testkit.v2client import CHAT_TEXT, V2Client


def _count_worker_chats(monkeypatch) -> list[bytes]:
    """The CHAT_TEXT payloads the v2 worker handled (heartbeats answered by the codec never get there)."""
    seen: list[bytes] = []
    real = legacy_v2.V2_HANDLERS[MsgType.CHAT_TEXT]

    async def counting(v2, ev):
        seen.append(ev.body)
        await real(v2, ev)

    monkeypatch.setitem(legacy_v2.V2_HANDLERS, MsgType.CHAT_TEXT, counting)
    return seen


async def test_heartbeats_to_an_idle_worker_are_answered_by_the_codec(tmp_path, monkeypatch):
    seen = _count_worker_chats(monkeypatch)
    async with running_server(tmp_path) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        for _ in range(50):
            v2.send(CHAT_TEXT, "HEARTBEAT")
            assert await v2.recv_text() == "HEARTBEAT"
        v2.send(CHAT_TEXT, "HEARTBEAT")
        v2.send(CHAT_TEXT, "HEARTBEAT")
        assert [await v2.recv_text(), await v2.recv_text()] == ["HEARTBEAT", "HEARTBEAT"]
        assert seen == []
        v2.send(CHAT_TEXT, "hi")            # a chat, then a heartbeat in the same read: the worker
        v2.send(CHAT_TEXT, "HEARTBEAT")     # answers it after the chat's end marker
        _, text, _ = await v2.read_answer()
        assert text == "echo: hi"
        assert await v2.recv_text() == "HEARTBEAT"
        assert seen == [b"hi", b"HEARTBEAT"]
        assert v2.only_v2_codes() and v2.seq_errors == 0
        await v2.close()


async def test_a_client_sending_only_heartbeats_outlives_the_handshake_timeout(tmp_path):
    async with running_server(tmp_path, handshake_timeout_s=0.3, legacy_grace_ms=50) as (srv, addr):
        v2, welcome = await V2Client.connect(addr, send_udp_port=False)  # greeted after the grace period
        assert welcome.startswith("Welcome")
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.0             # over three handshake timeouts of heartbeats only
        count = 0
        while loop.time() < end:
            v2.send(CHAT_TEXT, "HEARTBEAT")
            assert await v2.recv_text() == "HEARTBEAT"
            count += 1
        assert count > 0 and len(srv.connections) == 1
        assert v2.seq_errors == 0
        await v2.close()

"""Idle detection counts complete messages, not bytes; a v2 connection is not dropped while it is streamed to."""
from __future__ import annotations

import asyncio

import pytest

from protocol import MsgType, encode_frame
from server.agent.base import TurnResult
from testkit.echo_agent import EchoAgent
from testkit.server import V3Client, running_server
from testkit.v2client import CHAT_TEXT, V2Client

T = MsgType
TRICKLE_S = 0.02      # one byte (or frame) this often: far more often than the idle timeout


async def trickle(send, pieces: list[bytes], closed: asyncio.Event) -> int:
    """Send ``pieces`` one at a time (a slow client's pace) until the server closes; how many were sent."""
    for i, piece in enumerate(pieces):
        if closed.is_set():
            return i
        send(piece)
        await asyncio.sleep(TRICKLE_S)
    return len(pieces)


@pytest.mark.parametrize("how", ["bytes", "fragments"])
async def test_a_v3_message_trickled_forever_is_closed_at_idle_timeout(tmp_path, how):
    async with running_server(tmp_path, ping_interval_s=0.1, idle_timeout_s=0.5) as (srv, addr):
        c = await V3Client.connect(addr, auto_pong=False)
        if how == "bytes":  # one frame, one byte at a time, never finished
            frame = c.codec.send(T.SESSION_INFO, {"id": 1, "pad": "x" * 500})
            pieces = [frame[i:i + 1] for i in range(len(frame) - 1)]
        else:               # whole FRAGMENT frames of a message whose final frame never comes
            pieces = [encode_frame(T.FRAGMENT, c.codec.tx_seq + i, b"x" * 100) for i in range(500)]
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = await trickle(c.send_bytes, pieces, c.closed)
        assert sent < len(pieces), "the server kept a connection that never completed a message"
        err = await c.wait_type(T.ERROR)
        assert err.body["code"] == "IDLE_TIMEOUT" and err.body["fatal"] is True
        assert loop.time() - start < 5
        assert any(m.type == T.PING for m in c.inbox)  # it was pinged (and did not answer)
        await c.close()


async def test_a_v2_frame_trickled_forever_is_closed_at_idle_timeout(tmp_path):
    async with running_server(tmp_path, idle_timeout_s=0.5, ping_interval_s=0.1) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        frame = encode_frame(CHAT_TEXT, v2.seq, b"y" * 500)
        eof = asyncio.Event()

        async def wait_eof() -> None:
            try:
                assert await v2.expect_eof() == b""  # no v3 frame either
            except ConnectionResetError:  # a byte written after the server closed: RST, not FIN
                pass
            finally:
                eof.set()

        watcher = asyncio.get_running_loop().create_task(wait_eof())
        try:
            sent = await trickle(v2.writer.write, [frame[i:i + 1] for i in range(len(frame) - 1)], eof)
            assert sent < len(frame) - 1, "the server kept a connection that never completed a frame"
            await asyncio.wait_for(watcher, 5)
        finally:
            watcher.cancel()
        assert v2.only_v2_codes()
        await v2.close()


async def test_a_silent_connection_is_served_as_v2_then_closed_at_idle_timeout(tmp_path):
    async with running_server(tmp_path, legacy_grace_ms=50, idle_timeout_s=0.4, ping_interval_s=0.1) as (srv, addr):
        v2, welcome = await V2Client.connect(addr, send_udp_port=False)
        assert welcome.startswith("Welcome to NPLT Assistant")
        assert await v2.expect_eof() == b""  # closed, with no PING or ERROR frame (v3 codes)
        assert v2.only_v2_codes()
        await v2.close()


class SlowStreamAgent(EchoAgent):
    """Streams its answer one delta per ``pace`` seconds (a slow model), ``deltas`` of them."""

    def __init__(self, deltas: int, pace: float) -> None:
        super().__init__()
        self.deltas, self.pace = deltas, pace

    async def run_turn(self, req, sink):
        await sink.status("generating")
        for i in range(self.deltas):
            await sink.delta(f"{i} ")
            await asyncio.sleep(self.pace)
        text = "".join(f"{i} " for i in range(self.deltas))
        return TurnResult(text, [], {}, "stop", {})


async def test_a_v2_client_is_not_dropped_while_its_answer_streams(tmp_path):
    agent = SlowStreamAgent(deltas=15, pace=0.1)  # 1.5 s of streaming, idle timeout 0.5 s
    async with running_server(tmp_path, agent, idle_timeout_s=0.5, ping_interval_s=0.1) as (srv, addr):
        v2, _ = await V2Client.connect(addr)
        v2.send(CHAT_TEXT, "tell me slowly")
        loop = asyncio.get_running_loop()
        start = loop.time()
        _, text, chunks = await v2.read_answer()
        assert text == "".join(f"{i} " for i in range(15)) and chunks == 15
        assert loop.time() - start > 1.0
        # once the answer is over, the idle clock runs again
        assert await v2.expect_eof() == b""
        assert v2.only_v2_codes()
        await v2.close()

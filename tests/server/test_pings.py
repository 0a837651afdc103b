"""PINGs pipelined over TCP: runs answered in one go by the codec, mixed with requests, in order."""
from __future__ import annotations

import asyncio

from protocol import MsgType
from testkit.server import V3Client, running_server

T = MsgType


async def test_pipelined_pings_and_requests_are_answered_in_order(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        loop = asyncio.get_running_loop()
        ids: list = [*range(1000, 1040), "info", *range(2000, 2040), "s-1", 7, 8]
        futs = {i: loop.create_future() for i in ids}
        c._waiting.update(futs)
        data = b"".join(c.codec.send(T.SESSION_INFO if i == "info" else T.PING, {"id": i}) for i in ids)
        c.send_bytes(data)                      # one segment: runs of 40 PINGs around a request
        replies = {i: await asyncio.wait_for(f, 10) for i, f in futs.items()}
        assert c.protocol_error is None         # the client checked every seq it received
        assert replies["info"].type == T.RESPONSE and replies["info"].body["session"]["session_id"] == c.session_id
        pongs = [i for i in ids if i != "info"]
        assert all(replies[i].type == T.PONG and replies[i].body["re"] == i for i in pongs)
        assert all(isinstance(replies[i].body["time"], str) for i in pongs)
        # PONGs came back in the order of their PINGs (their frames carry increasing seqs)
        order = sorted(pongs, key=lambda i: replies[i].seq)
        assert order == pongs
        # a PING split across two writes is answered too, and the connection stays usable
        frame = c.codec.send(T.PING, {"id": 99})
        fut = c._waiting[99] = loop.create_future()
        c.send_bytes(frame[:7])
        await c.writer.drain()
        c.send_bytes(frame[7:])
        assert (await asyncio.wait_for(fut, 10)).body["re"] == 99
        assert (await c.call(T.SESSION_LIST))["sessions"]
        await c.close()


async def test_pings_one_per_read_while_an_answer_streams_keep_the_frames_in_order(tmp_path):
    """A read holding one PING is answered straight to the transport (``pong_one``) only when no
    frame is waiting to be sent; while a streamed answer's deltas are queued it goes after them.
    The client checks every seq, so a PONG sent ahead of frames numbered before it would fail."""
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        r = await c.call(T.CHAT_TEXT, text="!tokens 4000")
        times = set()
        for _ in range(60):                     # one PING a write, one at a time, as the answer streams
            pong = await c.call(T.PING)
            times.add(pong["time"])
        events = await c.turn_events(r["turn_id"], timeout=30)
        assert c.protocol_error is None
        assert events[-1].type == T.TURN_END and sum(m.type == T.ANSWER_DELTA for m in events) == 4000
        assert all(isinstance(t, str) and t.endswith("+00:00") for t in times)
        await c.close()


def test_the_pong_clock_is_fresh_to_the_millisecond_of_the_connection_clock(monkeypatch):
    """``iso_at``: the one-PING path's ISO time, recomputed when the monotonic ``now`` it is given is a
    millisecond past the last refresh, or before it (another event loop's clock); else cached."""
    from datetime import datetime

    from server import timeutil
    made: list[str] = []

    def fake_now_iso() -> str:
        made.append(f"2026-01-01T00:00:00.{len(made):06d}+00:00")
        return made[-1]

    monkeypatch.setattr(timeutil, "now_iso", fake_now_iso)
    monkeypatch.setattr(timeutil, "pong_clock", [-1.0, ""])
    first = timeutil.iso_at(100.0)
    assert timeutil.iso_at(100.0009) is first and len(made) == 1      # within the millisecond: cached
    assert timeutil.iso_at(100.001) == made[1]                         # a millisecond on: recomputed
    assert timeutil.iso_at(50.0) == made[2]                            # a clock behind it: recomputed
    assert timeutil.iso_at(50.0) == made[2] and len(made) == 3
    assert datetime.fromisoformat(made[2]).tzinfo is not None

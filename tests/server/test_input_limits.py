"""Partial input: given back when a connection closes, capped server-wide, and timed.

- An abandoned fragmented message is released when its connection closes, without waiting for a
  garbage-collection cycle (the test runs with the cyclic collector off and reads tracemalloc).
- Over ``max_total_input_buffer`` a growing fragmented message is refused (ERROR SERVER_BUSY, not
  fatal): the connection stays usable, and a side client's PING is answered meanwhile.
- ``message_timeout_s``: a message that has started must be complete in time (MESSAGE_TIMEOUT, fatal).
"""
from __future__ import annotations

import asyncio
import gc
import tracemalloc

from protocol import MsgType, encode_frame
from testkit.server import V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT

T = MsgType
FRAME = 65535
CHUNK = b"x" * FRAME


def fragments(client: V3Client, n: int) -> bytes:
    """``n`` FRAGMENT frames of 65,535 bytes with the client's next seqs (its codec is advanced)."""
    out = []
    for _ in range(n):
        out.append(client.codec.send_raw(T.FRAGMENT, CHUNK))   # (send_raw frames any type code)
    return b"".join(out)


async def test_an_abandoned_message_is_released_when_its_connection_closes(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        side = await V3Client.connect(addr)
        gc.collect()
        gc.disable()        # nothing may depend on the cyclic collector
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            held = []
            for _ in range(4):
                c = await V3Client.connect(addr)
                c.send_bytes(fragments(c, 127))      # ~8 MiB, never finished
                await c.writer.drain()
                await poll(lambda: srv.services.input_budget.total == 127 * FRAME)
                held.append(tracemalloc.get_traced_memory()[0] - base)
                await c.close()
                await poll(lambda: len(srv.connections) == 1)
                assert srv.services.input_budget.total == 0
            after = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
            gc.enable()
        assert held[0] > 127 * FRAME                  # it was held while the connection lived
        assert max(held) < 2 * 127 * FRAME            # one at a time: the earlier ones were released
        assert after < 4 << 20, after                 # and the last one too
        assert (await side.call(T.STATS))["clients"] == 1


async def test_over_the_server_wide_cap_a_growing_message_is_refused_and_the_connection_kept(tmp_path):
    cap = 1 << 20
    async with running_server(tmp_path, max_total_input_buffer=cap) as (srv, addr):
        side = await V3Client.connect(addr)
        holder = await V3Client.connect(addr)
        holder.send_bytes(fragments(holder, 12))     # 786,420 bytes held, under 15/16 of the cap
        await holder.writer.drain()
        await poll(lambda: srv.services.input_budget.total == 12 * FRAME)
        flooder = await V3Client.connect(addr)
        flooder.send_bytes(fragments(flooder, 8))    # takes the total over: refused, released
        await flooder.writer.drain()
        await poll(lambda: srv.services.input_budget.refused == 1)
        assert srv.services.input_budget.total <= cap
        assert (await side.call(T.PING))["re"]       # other clients are served meanwhile
        flooder.send_bytes(fragments(flooder, 4))    # the rest of the refused message is skipped...
        flooder.send(T.STATS, {"id": 99})            # ...up to its final frame: ERROR, not fatal
        msg = await flooder.wait_type(T.ERROR)
        assert msg.type == T.ERROR and msg.body["code"] == "SERVER_BUSY" and msg.body["fatal"] is False
        assert msg.body["re"] is None and "max_total_input_buffer" in msg.body["message"]
        assert (await flooder.call(T.STATS))["clients"] == 3   # the connection stays usable
        holder.send_bytes(fragments(holder, 2))      # the message that was under the cap completes
        holder.send(T.STATS, {"id": 99})
        msg = await holder.wait_type(T.ERROR)
        assert msg.type == T.ERROR and msg.body["code"] == "INVALID_JSON"   # (x's are not JSON)
        assert srv.services.input_budget.total == 0
        await flooder.close()
        await holder.close()
        await poll(lambda: len(srv.connections) == 1)
        assert srv.services.input_budget.total == 0
        await side.close()


async def test_a_message_not_finished_within_message_timeout_s_closes_the_connection(tmp_path):
    async with running_server(tmp_path, message_timeout_s=0.3, handshake_timeout_s=60) as (srv, addr):
        side = await V3Client.connect(addr)
        slow = await V3Client.connect(addr)
        slow.send_bytes(encode_frame(T.PING, slow.codec.tx_seq, b'{"id": 1}')[:7])  # a started frame
        await slow.wait_closed()
        err = [m for m in slow.inbox if m.type == T.ERROR]
        assert err and err[0].body["code"] == "MESSAGE_TIMEOUT" and err[0].body["fatal"] is True
        # a fragmented message trickled frame by frame is one message: timed as a whole
        trickle = await V3Client.connect(addr)
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not trickle.closed.is_set():
            trickle.send_bytes(fragments(trickle, 1))
            await asyncio.wait([loop.create_task(trickle.closed.wait())], timeout=0.05)  # (pacing)
        assert loop.time() - start >= 0.3
        assert [m.body["code"] for m in trickle.inbox if m.type == T.ERROR] == ["MESSAGE_TIMEOUT"]
        # complete messages one after another never time out, however long the connection lives
        for _ in range(3):
            assert (await side.call(T.PING))["re"]
        await poll(lambda: len(srv.connections) == 1)
        assert srv.services.input_budget.total == 0
        # v2: a started frame is timed too (the client just sees the close)
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(encode_frame(CHAT_TEXT, 0, b"HEARTBEAT")[:6])
        data = await asyncio.wait_for(reader.read(), 10)
        assert b"Welcome" in data and b"HEARTBEAT" not in data   # greeted, then closed
        writer.close()
        await side.close()

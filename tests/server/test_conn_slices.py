"""Issue 15, item 9: a read holding thousands of pipelined requests is fed to the codec RX_SLICE_BYTES
at a time, one slice per loop iteration (reading paused meanwhile), so a flooding connection cannot
hold the event loop. Every
request is still answered once, in order, and the connection stays usable; the other clients too."""
from __future__ import annotations

import asyncio

from protocol import MsgType
from server.connection import ServerConnection
from server.rx_budget import RX_SLICE_BYTES
from testkit.server import V3Client, running_server

T = MsgType


async def test_a_flood_in_one_segment_is_answered_in_slices_in_order(tmp_path, monkeypatch):
    n = 6000   # about 96 KiB
    slices = []
    real = ServerConnection.rx_step
    monkeypatch.setattr(ServerConnection, "rx_step", lambda self: (slices.append(len(self._rx_backlog or b"")),
                                                                       real(self))[1])
    async with running_server(tmp_path, max_pending_requests=8) as (srv, addr):
        c = await V3Client.connect(addr)
        bystander = await V3Client.connect(addr)
        loop = asyncio.get_running_loop()
        futs = []
        data = []
        for i in range(1, n + 1):
            futs.append(c._waiting.setdefault(10000 + i, loop.create_future()))
            data.append(c.codec.send(T.STATS if i % 3 else T.PING, {"id": 10000 + i}))
        assert len(b"".join(data)) > 8 * RX_SLICE_BYTES
        c.send_bytes(b"".join(data))
        replies = [await asyncio.wait_for(f, 30) for f in futs]
        assert [m.body["re"] for m in replies] == list(range(10001, n + 10001))
        codes = {m.body.get("code") for m in replies if m.type == T.ERROR}
        assert codes <= {"TOO_MANY_PENDING"}
        assert sum(m.type == T.PONG for m in replies) == n // 3
        assert len(slices) >= 5 and max(slices) > RX_SLICE_BYTES   # handled over many loop iterations
        assert all(x._rx_backlog is None for x in srv.connections) and not c.closed.is_set()
        assert (await c.call(T.STATS))["clients"] == 2
        assert (await bystander.call(T.PING))["re"]
        await c.close()
        await bystander.close()

"""Review s33 (t23_export_rss.py): clients that pipelined exports, never read them and left kept the
server's RSS up by ~5 MiB each: ``malloc_trim`` ran only after partial input was released. Now a
connection that closes having held a large output backlog (``TRIM_OUTPUT_BYTES``) asks for one too."""
from __future__ import annotations

import socket

from protocol import MsgType
from server.conn_limits import TRIM_OUTPUT_BYTES, _malloc_trim
from testkit.server import V3Client, non_reading_client, poll, running_server

T = MsgType


async def test_a_connection_that_leaves_with_a_large_backlog_unsent_asks_for_a_trim(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        good = await V3Client.connect(addr)
        for _ in range(3):                           # an export of ~3 MB: well over it
            r = await good.call(T.CHAT_TEXT, text="!big 1000000")
            await good.turn_events(r["turn_id"], timeout=30)
        budget = srv.services.input_budget
        small = await V3Client.connect(addr)         # a connection that leaves with nothing unsent
        assert (await small.call(T.PING))["re"]
        await small.close()
        await poll(lambda: len(srv.connections) == 1, what="the small one gone")
        assert budget.trim_requests == 0

        slow = await non_reading_client(addr)
        port = slow.writer.get_extra_info("sockname")[1]
        conn = next(c for c in srv.connections if c.peer.endswith(f":{port}"))
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        slow.writer.write(b"".join(slow.codec.send(T.HISTORY_EXPORT, {"id": i, "format": "json",
                                                                      "session_id": good.session_id})
                                   for i in range(4)))
        await poll(lambda: conn.transport.get_write_buffer_size() > TRIM_OUTPUT_BYTES, what="its backlog")
        trims = budget.trims
        slow.writer.transport.abort()                # it leaves (a reset): nothing it asked for is sent
        await poll(lambda: conn not in srv.connections, what="the slow one gone")
        assert budget.trim_requests == 1 and budget.total == 0   # (no partial input was released)
        if _malloc_trim is not None:                 # glibc: the trim runs, in a worker thread
            await poll(lambda: budget.trims == trims + 1, what="the trim")
        assert (await good.call(T.PING))["re"]
        await good.close()

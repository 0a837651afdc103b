"""Memory per connection stays bounded by its output: replies are not built for a client that does not read."""
from __future__ import annotations

import asyncio
import socket

from protocol import MsgType
from testkit.server import V3Client, non_reading_client, poll, running_server

T = MsgType
EXPORTS = 10


def count_exports(srv) -> list[int]:
    """Count the exports the server builds (each one is a whole reply of about 1 MB)."""
    built = [0]
    export = srv.store.export

    async def counting(*args, **kwargs):
        built[0] += 1
        return await export(*args, **kwargs)

    srv.store.export = counting
    return built


async def big_session(addr) -> V3Client:
    good = await V3Client.connect(addr)
    r = await good.call(T.CHAT_TEXT, text="!big 1000000")  # a 1 MB answer to export
    await good.turn_events(r["turn_id"], timeout=30)
    return good


async def test_a_client_that_does_not_read_gets_no_new_reply_built(tmp_path):
    async with running_server(tmp_path, max_output_buffer=65536, ping_interval_s=0.5) as (srv, addr):
        good = await big_session(addr)
        built = count_exports(srv)
        slow = await non_reading_client(addr)
        conn = next(c for c in srv.connections if c.peer.endswith(f":{slow.writer.get_extra_info('sockname')[1]}"))
        # small kernel buffers on both ends: what the client does not read stays in the server's transport
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        slow.writer.write(b"".join(slow.codec.send(T.HISTORY_EXPORT, {"id": i, "format": "json"})
                             for i in range(EXPORTS)))  # ten 1 MB replies asked in one segment
        await poll(lambda: built[0] >= 1)
        await poll(lambda: conn.transport.get_write_buffer_size() > 65536 or srv.slow_consumers)
        # while its output does not drain, nothing more is built for it...
        assert built[0] == 1 and len(conn.pending) == EXPORTS - 1 and not srv.slow_consumers
        # ...and the next output due (the server's PING) finds it over the cap: dropped
        await poll(lambda: srv.slow_consumers == 1, timeout=10)
        await poll(lambda: conn not in srv.connections)
        assert built[0] == 1 and not conn.pending
        assert (await good.call(T.PING))["re"]
        slow.writer.close()
        await good.close()


async def test_a_reading_client_gets_every_large_reply_it_pipelined(tmp_path):
    async with running_server(tmp_path, max_output_buffer=65536) as (srv, addr):
        good = await big_session(addr)
        built = count_exports(srv)
        c = await V3Client.connect(addr)
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(5)]
        for i, fut in enumerate(futs):
            c._waiting[f"e{i}"] = fut
        c.send_bytes(b"".join(c.codec.send(T.HISTORY_EXPORT, {"id": f"e{i}", "format": "json"}) for i in range(5)))
        replies = [await asyncio.wait_for(f, 30) for f in futs]
        assert [m.type for m in replies] == [T.RESPONSE] * 5  # each over the cap alone, none dropped
        assert all(len(m.body["content"]) > 1_000_000 for m in replies)
        assert built[0] == 5 and srv.slow_consumers == 0
        for x in (c, good):
            await x.close()

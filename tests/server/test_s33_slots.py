"""Export slots and clients that do not read (review s33, export_hold.py): an export's slot is held
until its reply has left the server, but the stall check ran only while a transport held more than
``max_output_buffer``. An export under that cap (a ~6 MB one leaves ~1.5 MB in the transport once
the kernel took its share) was never judged: two clients that requested one and never read held
both slots (``max_concurrent_exports`` = 2) until ``idle_timeout_s`` (300 s), and every other export
on the server waited, with no reply at all. Now a connection whose reply holds a slot is judged
from its first unsent byte (``SLOW_CONSUMER_STALL_S`` without progress: dropped, slot released),
and an export waits at most ``EXPORT_SLOT_WAIT_S`` for a slot (then SERVER_BUSY, not fatal).

Real sockets over loopback: the clients that stop reading have a 4 KiB receive buffer (and the
server's end a 4 KiB send buffer), so what they do not read stays in the server's transport."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import server.handlers.history as history_mod
import server.output as output_mod
from protocol import MsgType
from server.handlers.history import export_slots
from testkit.server import ReplyError, V3Client, poll, running_server
from testkit.raw_sockets import big_session, paused_client

T = MsgType
CAP = 4 << 20            # the default max_output_buffer: the replies below stay under it


def held_under_the_cap(conn: Any) -> bool:
    """The reply is in the transport, over its high-water mark (not drained) and under the cap."""
    backlog = conn.transport.get_write_buffer_size() if conn.transport is not None else 0
    return output_mod.HIGH_WATER < backlog <= CAP and not conn.output.out


async def two_stopped_exports(srv: Any, addr: tuple[str, int], sid: str) -> list[tuple[V3Client, Any]]:
    """Two clients that request the export of ``sid`` and never read its reply: both slots taken."""
    stopped = []
    for _ in range(2):
        c, conn = await paused_client(srv, addr)
        c.send(T.HISTORY_EXPORT, {"id": 99, "format": "json", "session_id": sid})
        stopped.append((c, conn))
    for _, conn in stopped:
        await poll(lambda: held_under_the_cap(conn) or conn not in srv.connections,
                   what="the export reply held in the transport, under max_output_buffer")
    return stopped


async def test_clients_that_stop_reading_under_the_cap_give_their_export_slots_back(tmp_path, monkeypatch):
    """(export_hold.py: the third export was not answered after 40 s.) Both clients hold their
    reply under ``max_output_buffer``; they are dropped SLOW_CONSUMER once SLOW_CONSUMER_STALL_S
    passes without progress, their slots go back, and a third client's export is answered."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 0.5, raising=False)
    async with running_server(tmp_path, max_concurrent_exports=2) as (srv, addr):
        assert srv.config.limits.max_output_buffer == CAP
        good = await big_session(addr)
        small = (await good.call(T.SESSION_NEW))["session"]["session_id"]
        slots = export_slots(srv.services)
        stopped = await two_stopped_exports(srv, addr, good.session_id)
        t0 = time.monotonic()
        rep = await good.call(T.HISTORY_EXPORT, format="json", session_id=small, timeout=8)
        assert rep["session_id"] == small and rep["content"]
        assert time.monotonic() - t0 < 8
        await poll(lambda: srv.slow_consumers == 2, what="both stopped clients dropped")
        for _, conn in stopped:
            await poll(lambda: conn not in srv.connections, what="the stopped connection gone")
        await poll(lambda: slots.building == 0 and slots.waiting == 0, what="the slots free")
        for c, _ in stopped:
            await c.close()
        await good.close()


async def test_an_export_waits_for_a_slot_at_most_export_slot_wait_s(tmp_path, monkeypatch):
    """While both slots are held (clients not judged yet: a long stall time), a third export is
    refused SERVER_BUSY (not fatal) after EXPORT_SLOT_WAIT_S instead of waiting without a reply; the
    wait takes no slot, and once the slots are free an export is served again."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 60.0, raising=False)
    monkeypatch.setattr(history_mod, "EXPORT_SLOT_WAIT_S", 0.5, raising=False)
    async with running_server(tmp_path, max_concurrent_exports=2) as (srv, addr):
        good = await big_session(addr)
        small = (await good.call(T.SESSION_NEW))["session"]["session_id"]
        slots = export_slots(srv.services)
        stopped = await two_stopped_exports(srv, addr, good.session_id)
        assert slots.building == 2
        t0 = time.monotonic()
        with pytest.raises(ReplyError) as err:
            await good.call(T.HISTORY_EXPORT, format="json", session_id=small, timeout=8)
        assert time.monotonic() - t0 < 8
        assert err.value.code == "SERVER_BUSY" and err.value.body["fatal"] is False
        assert "max_concurrent_exports" in err.value.body["message"]
        assert slots.waiting == 0 and slots.building == 2
        assert (await good.call(T.PING))["re"]              # the connection goes on
        for c, _ in stopped:                                  # the stopped clients leave: slots back
            await c.close()
        await poll(lambda: slots.building == 0, what="the slots free")
        rep = await good.call(T.HISTORY_EXPORT, format="json", session_id=small)
        assert rep["session_id"] == small and srv.slow_consumers == 0
        await good.close()


async def test_a_steady_reader_under_the_cap_keeps_its_slot(tmp_path, monkeypatch):
    """Judged from the first byte does not mean dropped for being slow: a client reading its reply
    at a steady ~400 KB/s for longer than the stall time gets it whole and is kept."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 0.5, raising=False)
    async with running_server(tmp_path, max_concurrent_exports=1) as (srv, addr):
        good = await big_session(addr)
        slots = export_slots(srv.services)
        c, conn = await paused_client(srv, addr)
        reply = asyncio.get_running_loop().create_future()
        c._waiting["r"] = reply
        c.send(T.HISTORY_EXPORT, {"id": "r", "format": "json", "session_id": good.session_id})
        await poll(lambda: held_under_the_cap(conn), what="the export reply held in the transport")
        assert slots.building == 1
        t0 = time.monotonic()
        while not reply.done():
            data = await asyncio.wait_for(c.reader.read(8192), 10)
            assert data, "the server closed the connection of a client that reads"
            for ev in c.codec.receive_data(data):
                await c._on_message(ev)
            await asyncio.sleep(0.02)     # (the pace of the simulated link, not a synchronisation)
        assert time.monotonic() - t0 > 1.0                    # longer than the stall time
        assert len(reply.result().body["content"]) > 1_000_000
        assert srv.slow_consumers == 0 and conn in srv.connections
        await poll(lambda: slots.building == 0, what="the slot free once the reply has left")
        await c.close()
        await good.close()

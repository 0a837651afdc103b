"""Unsent output (review s33): a client is judged by whether it reads, not by an event falling due
while a large reply drains; one that stopped reading is dropped after ``SLOW_CONSUMER_STALL_S``
without waiting for the next output; an export holds its slot until its reply has left; and new
exports are refused SERVER_BUSY while the unsent output of all connections is over
``[limits] max_total_output_buffer``."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

import server.output as output_mod
from protocol import MsgType
from server.config import ServerConfig
from server.handlers.history import export_slots
from server.metrics import server_state
from testkit.server import ReplyError, V3Client, poll, running_server
from testkit.raw_sockets import big_session, paused_client

T = MsgType
CAP = 65536          # the smallest max_output_buffer


def total_unsent(connections: Any) -> int:
    """Unsent output of every connection: queued in the server plus held by its transport."""
    return sum(c.output.size + (c.transport.get_write_buffer_size() if c.transport is not None else 0)
               for c in connections)


def expect(c: V3Client, rid: Any) -> asyncio.Future:
    """The reply to ``rid``, which ``c`` will read once resumed."""
    fut = asyncio.get_running_loop().create_future()
    c._waiting[rid] = fut
    return fut


def resume(c: V3Client) -> None:
    c.closed.clear()
    c._task = asyncio.get_running_loop().create_task(c._read_loop())


async def read_slowly(c: V3Client, done: Any, chunk: int = 8192, pause: float = 0.02) -> None:
    """Read ``chunk`` bytes every ``pause`` seconds (a slow link: at most ~400 KB/s) until ``done()``."""
    while not done():
        data = await asyncio.wait_for(c.reader.read(chunk), 10)
        if not data:
            return
        for ev in c.codec.receive_data(data):
            await c._on_message(ev)
        await asyncio.sleep(pause)     # (the pace of the simulated link, not a synchronisation)


async def test_a_slow_steady_reader_is_not_dropped_when_an_event_falls_due(tmp_path, monkeypatch):
    """(review s33, t29b: a client reading an 8 MB export at 200 KB/s was dropped as SLOW_CONSUMER
    as soon as a SESSION_EVENT from a rename on another connection was due.) The event is held while
    the reply drains, then delivered after it; the client reads slowly for longer than the stall
    time and is kept, because it makes progress."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 1.0)
    async with running_server(tmp_path, max_output_buffer=CAP) as (srv, addr):
        good = await big_session(addr)
        slow, conn = await paused_client(srv, addr)
        reply = expect(slow, "x")
        slow.send(T.HISTORY_EXPORT, {"id": "x", "session_id": good.session_id, "format": "json"})
        await poll(lambda: conn.transport.get_write_buffer_size() > CAP, what="the export over the cap")
        await good.call(T.SESSION_RENAME, session_id=good.session_id, title="renamed meanwhile")
        # the SESSION_EVENT is due while the client is over its cap
        await poll(lambda: conn.output.size > 0 or srv.slow_consumers, what="the event queued")
        assert srv.slow_consumers == 0 and conn in srv.connections
        await read_slowly(slow, lambda: reply.done() and any(
            m.type == T.SESSION_EVENT and m.body["kind"] == "renamed" for m in slow.inbox))
        body = (await reply).body
        assert len(body["content"]) > 1_000_000                 # the whole export...
        renamed = [m for m in slow.inbox if m.type == T.SESSION_EVENT and m.body["kind"] == "renamed"]
        assert renamed[0].body["session"]["title"] == "renamed meanwhile"   # ...then the event
        assert srv.slow_consumers == 0 and conn in srv.connections
        resume(slow)
        assert (await slow.call(T.PING))["re"]
        for c in (slow, good):
            await c.close()


async def test_a_client_that_stopped_reading_is_dropped_after_the_stall_time(tmp_path, monkeypatch):
    """Over its cap and not reading: dropped once SLOW_CONSUMER_STALL_S has passed without
    progress, with no more output due (before, only the server's PING, ``ping_interval_s`` = 60 s
    later, found it: 40 such clients held 415 MiB for a minute)."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 0.5)
    async with running_server(tmp_path, max_output_buffer=CAP) as (srv, addr):
        good = await big_session(addr)
        slow, conn = await paused_client(srv, addr)
        slow.send(T.HISTORY_EXPORT, {"id": 1, "session_id": good.session_id, "format": "json"})
        await poll(lambda: conn.transport.get_write_buffer_size() > CAP or srv.slow_consumers,
                   what="the export over the cap")
        await poll(lambda: srv.slow_consumers == 1, timeout=5, what="dropped after the stall time")
        await poll(lambda: conn not in srv.connections, what="the connection gone")
        assert total_unsent(srv.connections) < CAP
        assert (await good.call(T.PING))["re"]
        await slow.close()
        await good.close()


async def test_an_export_holds_its_slot_until_its_reply_has_left(tmp_path, monkeypatch):
    """(review s33, t24: the slot was given back once the reply was built, so clients that do not
    read could each hold a whole export.) With one slot, a second export waits while the first
    reply has not drained; it goes on once the first client reads, or once it is dropped."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 30.0)
    async with running_server(tmp_path, max_output_buffer=CAP, max_concurrent_exports=1) as (srv, addr):
        good = await big_session(addr)
        slots = export_slots(srv.services)
        slow, conn = await paused_client(srv, addr)
        first = expect(slow, "a")
        slow.send(T.HISTORY_EXPORT, {"id": "a", "session_id": good.session_id, "format": "json"})
        await poll(lambda: conn.transport.get_write_buffer_size() > CAP, what="the export over the cap")
        second = asyncio.create_task(good.call(T.HISTORY_EXPORT, format="markdown", timeout=30))
        await poll(lambda: slots.waiting == 1 or second.done(), what="the second export waits")
        assert not second.done() and slots.building == 1
        assert (await good.call(T.PING))["re"]             # other requests go on meanwhile
        resume(slow)
        assert len((await asyncio.wait_for(first, 30)).body["content"]) > 1_000_000
        assert (await second)["content"].startswith("# ")
        await poll(lambda: slots.building == 0 and slots.waiting == 0, what="the slot free")
        # a client that never reads gives its slot back when it is dropped
        conn.output.stall_s = 0.5
        slow._task.cancel()
        await asyncio.gather(slow._task, return_exceptions=True)
        slow.send(T.HISTORY_EXPORT, {"id": "b", "session_id": good.session_id, "format": "json"})
        await poll(lambda: conn.transport.get_write_buffer_size() > CAP, what="the export over the cap")
        third = asyncio.create_task(good.call(T.HISTORY_EXPORT, format="markdown", timeout=30))
        await poll(lambda: slots.waiting == 1 or third.done(), what="the third export waits")
        assert (await third)["content"].startswith("# ")
        assert srv.slow_consumers == 1 and conn not in srv.connections
        await poll(lambda: slots.building == 0, what="the slot free")
        await slow.close()
        await good.close()


async def test_exports_are_refused_server_busy_past_max_total_output_buffer(tmp_path, monkeypatch):
    """Unsent output is counted across connections: past ``max_total_output_buffer`` an export is
    refused SERVER_BUSY (not fatal) before it is built; once the output has drained it is served. The
    limit is in the HELLO reply's limits, with max_sessions_per_user."""
    monkeypatch.setattr(output_mod, "SLOW_CONSUMER_STALL_S", 30.0)
    async with running_server(tmp_path, max_output_buffer=CAP, max_total_output_buffer=1 << 20,
                              max_concurrent_exports=3) as (srv, addr):
        good = await big_session(addr)
        limits = good.hello["limits"]
        assert limits["max_total_output_buffer"] == 1 << 20 and limits["max_sessions_per_user"] == 10_000
        slow = [await paused_client(srv, addr) for _ in range(2)]
        firsts = []
        for c, conn in slow:     # two replies of ~1 MB each, not read
            firsts.append(expect(c, "a"))
            c.send(T.HISTORY_EXPORT, {"id": "a", "session_id": good.session_id, "format": "json"})
            await poll(lambda: conn.transport.get_write_buffer_size() > CAP, what="the export over the cap")
        assert total_unsent(srv.connections) > 1 << 20
        assert server_state(srv)["output_unsent_bytes"] > 1 << 20     # (the nplt_output_unsent_bytes gauge)
        with pytest.raises(ReplyError) as err:
            await good.call(T.HISTORY_EXPORT, format="json")
        assert err.value.code == "SERVER_BUSY" and "max_total_output_buffer" in err.value.body["message"]
        assert err.value.body["fatal"] is False and export_slots(srv.services).building == 2
        for c, _ in slow:
            resume(c)
        for fut in firsts:
            assert len((await asyncio.wait_for(fut, 30)).body["content"]) > 1_000_000
        got = await good.call(T.HISTORY_EXPORT, format="json")
        assert len(got["content"]) > 1_000_000 and srv.slow_consumers == 0
        for c in [good] + [c for c, _ in slow]:
            await c.close()


def test_max_total_output_buffer_is_a_limit_with_a_safe_default():
    assert ServerConfig.from_dict({}, env={}).limits.max_total_output_buffer == 256 << 20
    for bad in (0, (1 << 20) - 1, (1 << 40) + 1):
        with pytest.raises(Exception, match="max_total_output_buffer"):
            ServerConfig.from_dict({"limits": {"max_total_output_buffer": bad}}, env={})

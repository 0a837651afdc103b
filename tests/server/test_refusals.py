"""Refused connections are counted, and logged at most once per interval (a flood writes few lines)."""
from __future__ import annotations

import logging

from protocol import MsgType
from server.refusals import Refusals
from testkit.server import V3Client, running_server

T = MsgType


def test_refusals_are_counted_and_their_log_lines_throttled(caplog):
    now = [100.0]
    r = Refusals(interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="nplt.conn")
    assert r.note(1, "a:1", "max_clients reached") is True       # the first: at once
    assert [r.note(i, "a:1", "max_clients reached") for i in range(2, 50)] == [False] * 48
    now[0] += 9.9
    assert r.note(50, "b:2", "max_clients reached") is False
    now[0] += 0.2
    assert r.note(51, "c:3", "max_clients reached") is True      # one line for the 50 since
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == ["connection 1 from a:1 refused: max_clients reached",
                     "50 connections refused in the last 10 s (max_clients reached); latest: 51 from c:3"]
    assert r.total == 51
    now[0] += 60
    assert r.note(52, "d:4", "shutting down") is True             # quiet again: a plain line
    assert caplog.records[-1].getMessage() == "connection 52 from d:4 refused: shutting down"


async def test_a_flood_over_max_clients_is_refused_counted_and_logged_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="nplt.conn")
    async with running_server(tmp_path, max_clients=1) as (srv, addr):
        a = await V3Client.connect(addr)
        for _ in range(20):
            extra = await V3Client.connect(addr, hello=False)
            msg = await extra.request(T.HELLO, proto=3, client="flood")
            assert msg.body["code"] == "SERVER_FULL"
            await extra.wait_closed()
        stats = await a.call(T.STATS)
        assert stats["refused_total"] == 20 and stats["clients"] == 1 and stats["slow_consumers_total"] == 0
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1
        await a.close()

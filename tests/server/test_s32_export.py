"""HISTORY_EXPORT's resources (review s32): an export too large for one reply is refused while it is
built, as soon as the part built is over max_message_size (not after building all of it), and at
most ``[limits] max_concurrent_exports`` exports are built at once, server-wide."""
from __future__ import annotations

import asyncio
import gc
import random
import socket
import struct
import threading
import tracemalloc

import orjson
import pytest

import storage.pg.store as pg_store
import storage.store as json_store
from pg.dbs import drop_database, fresh_database
from pg.pgserver import shared_server, stop_shared
from protocol import MsgType
from server.config import ServerConfig
from server.handlers.history import export_slots
from storage import StorageConfig
from storage.export import ExportTooLarge, export, wire_size
from storage.models import ChatMessage, SessionRecord, SummaryRecord, ToolCall
from storage.port import open_store
from testkit.server import ReplyError, V3Client, poll, running_server

T = MsgType
_CHARS = 'ab c\n"\\\t`<>&é中😀\x01\x7f\u2028'


def _text(rnd: random.Random, n: int) -> str:
    return "".join(rnd.choice(_CHARS) for _ in range(rnd.randint(0, n)))


def _session(rnd: random.Random) -> tuple[SessionRecord, list[ChatMessage]]:
    summaries = [SummaryRecord.from_dict({"covers_to_id": rnd.choice([0, 2]), "text": _text(rnd, 20),
                                          "created_at": "2024-01-01T00:00:00Z"}) for _ in range(rnd.randint(0, 3))]
    rec = SessionRecord("s_20240101_000000000000", "alice", _text(rnd, 10), "c", "u", 3,
                        model=rnd.choice([None, "m"]), summaries=summaries,
                        system_prompt=rnd.choice([None, _text(rnd, 20)]))
    metas = [{}, {"partial": True}, {"finish_reason": "cancelled"}, {"error": "LLM_ERROR", "attempts": 3},
             {"citations": [{"citation": "[doc 1]"}]}, {"context": {"ids": [1, 2]}}, {"superseded": True}]
    msgs = [ChatMessage(i, rnd.choice(["user", "assistant"]), _text(rnd, 60), "2024-01-01T00:00:00Z",
                        [ToolCall(f"c{j}", "sh", {"cmd": _text(rnd, 10)}, _text(rnd, 30), step=j)
                         for j in range(rnd.randint(0, 2))], rnd.choice(metas))
            for i in range(1, rnd.randint(0, 6) + 1)]
    return rec, msgs


def test_exports_are_the_same_text_and_their_size_is_counted_exactly():
    """The JSON export is still ``orjson.dumps(doc, OPT_INDENT_2)``, whether the messages come as a
    list or one by one; a budget of exactly the text's size in a reply lets it through, one byte less
    refuses it (the count of escapes, multi-byte characters and newlines is exact)."""
    rnd = random.Random(32)
    for _ in range(150):
        rec, msgs = _session(rnd)
        doc = {"schema_version": 1, "session": rec.to_dict(), "messages": [m.to_dict() for m in msgs]}
        assert export(rec, iter(msgs), "json") == orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()
        for fmt in ("json", "markdown"):
            text = export(rec, msgs, fmt)
            assert export(rec, iter(msgs), fmt) == text
            room = wire_size(text)
            assert room == len(orjson.dumps(text)) - 2
            assert export(rec, msgs, fmt, max_bytes=room) == text
            with pytest.raises(ExportTooLarge) as err:
                export(rec, msgs, fmt, max_bytes=room - 1)
            assert err.value.size > room - 1 and err.value.total == len(msgs)


def test_a_refused_export_does_not_keep_what_it_built():
    """The error raised for an export over its budget does not hold the pieces built so far (its
    traceback held the builder's frames: with a reference cycle around it, as asyncio's futures make,
    megabytes per refused export stayed until a full garbage collection; seen growing RSS by
    ~100 MiB per round of 8 refused exports)."""
    rec = SessionRecord("s_20240101_000000000000", "alice", "t", "c", "u", 1)
    msgs = [ChatMessage(i, "user", f"{i} " + "q" * 20_000) for i in range(1, 201)]
    for fmt in ("json", "markdown"):
        gc.disable()
        try:
            tracemalloc.start()
            try:
                export(rec, iter(msgs), fmt, max_bytes=2_000_000)
            except ExportTooLarge as exc:
                kept = exc                        # as a future or a cycle would keep it
            held, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        finally:
            gc.enable()
        assert kept.size > 2_000_000 and kept.done < 120
        assert held < 200_000, held


def test_markdown_fences_outgrow_the_backtick_runs_inside():
    rec = SessionRecord("s_20240101_000000000000", "alice", "t", "c", "u", 1, system_prompt="a ````` b ` c")
    md = export(rec, [ChatMessage(1, "assistant", "x", tool_calls=[ToolCall("c1", "sh", {}, "``` ``")])], "markdown")
    assert "``````\na ````` b ` c\n``````" in md and "````\n``` ``\n````" in md


def test_max_concurrent_exports_is_a_limit_with_a_safe_default():
    assert ServerConfig.from_dict({}, env={}).limits.max_concurrent_exports == 2
    assert ServerConfig.from_dict({"limits": {"max_concurrent_exports": 64}}, env={}).limits.max_concurrent_exports == 64
    for bad in (0, 65):
        with pytest.raises(Exception, match="max_concurrent_exports"):
            ServerConfig.from_dict({"limits": {"max_concurrent_exports": bad}}, env={})


class _Counted:
    """Wraps a converter (stored message -> ChatMessage) and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@pytest.mark.parametrize("fmt", ["json", "markdown"])
async def test_an_export_over_max_message_size_is_refused_before_it_is_all_built(tmp_path, monkeypatch, fmt):
    limit, n = 65535, 400                        # ~400 KB of text: six times what a reply may hold
    async with running_server(tmp_path, max_message_size=limit) as (srv, addr):
        c = await V3Client.connect(addr)
        store = srv.services.store
        for i in range(n):
            await store.append(c.session_id, "user" if i % 2 == 0 else "assistant", f"{i} " + "y" * 1000)
        counted = _Counted(json_store.to_message)
        monkeypatch.setattr(json_store, "to_message", counted)
        with pytest.raises(ReplyError) as err:
            await c.call(T.HISTORY_EXPORT, format=fmt)
        msg = err.value.body["message"]
        assert err.value.code == "MESSAGE_TOO_LARGE", msg
        assert f"over max_message_size ({limit} bytes)" in msg and "bytes so far" in msg, msg
        assert f"of {n} messages" in msg and "HISTORY_REQUEST" in msg, msg
        assert counted.calls <= 80, counted.calls           # ~64 converted, not 400
        assert (await c.call(T.PING))["re"]                  # the connection is still usable
        # a session that fits is exported whole, with the same converter
        small = (await c.call(T.SESSION_NEW))["session"]["session_id"]
        await store.append(small, "user", "short")
        got = await c.call(T.HISTORY_EXPORT, format=fmt, session_id=small)
        assert "short" in got["content"] and counted.calls <= 81
        await c.close()


async def test_exports_built_at_once_are_bounded_by_max_concurrent_exports(tmp_path, monkeypatch):
    gate = threading.Event()
    lock = threading.Lock()
    active = {"now": 0, "max": 0}
    real = json_store.HistoryStore.export

    def slow_export(self, *args, **kwargs):
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        try:
            if not gate.wait(30):
                raise TimeoutError("the test never opened the gate")
            return real(self, *args, **kwargs)
        finally:
            with lock:
                active["now"] -= 1

    monkeypatch.setattr(json_store.HistoryStore, "export", slow_export)
    async with running_server(tmp_path, max_concurrent_exports=2) as (srv, addr):
        clients = [await V3Client.connect(addr) for _ in range(5)]
        try:
            slots = export_slots(srv.services)
            calls = [asyncio.create_task(c.call(T.HISTORY_EXPORT, format="markdown", timeout=30)) for c in clients]
            await poll(lambda: slots.building == 2 and slots.waiting == 3, what="2 exports built, 3 waiting")
            await poll(lambda: active["now"] == 2, what="2 exports in the store")
            assert active["max"] == 2
            assert (await clients[0].call(T.PING))["re"]       # others are served meanwhile
        finally:
            gate.set()
        replies = await asyncio.gather(*calls)
        assert all(r["format"] == "markdown" and r["content"].startswith("# ") for r in replies)
        assert active["max"] == 2 and slots.building == 0 and slots.waiting == 0
        for c in clients:
            await c.close()


async def test_an_export_whose_client_left_while_it_waited_is_not_built(tmp_path, monkeypatch):
    gate = threading.Event()
    builds = []
    real = json_store.HistoryStore.export

    def slow_export(self, *args, **kwargs):
        builds.append(args[0])
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(json_store.HistoryStore, "export", slow_export)
    async with running_server(tmp_path, max_concurrent_exports=1) as (srv, addr):
        a, b = await V3Client.connect(addr), await V3Client.connect(addr)
        slots = export_slots(srv.services)
        try:
            first = asyncio.create_task(a.call(T.HISTORY_EXPORT, format="json", timeout=30))
            await poll(lambda: len(builds) == 1, what="a's export is being built")
            b.send(T.HISTORY_EXPORT, {"id": 1, "format": "json"})
            await poll(lambda: slots.waiting == 1, what="b's export waits for the slot")
            # b is gone: a reset (an EOF is a half-close, whose requests are still answered)
            b.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            b.writer.transport.abort()
            await poll(lambda: len(srv.connections) == 1, what="the server saw b leave")
        finally:
            gate.set()
        assert orjson.loads((await first)["content"])["session"]["session_id"] == a.session_id
        await poll(lambda: slots.waiting == 0 and slots.building == 0, what="the slots are free")
        assert builds == [a.session_id]                  # b's export was never built
        await a.close()
        await b.close()


# -- both backends: the store converts only what it builds ------------------------------------------

@pytest.fixture(scope="session")
def pg_server():                     # (as tests/storage_port: the session's embedded PostgreSQL)
    try:
        yield shared_server()
    finally:
        stop_shared()


@pytest.fixture(params=["json", "pg"])
async def store_and_converter(request, tmp_path):
    url = server = None
    if request.param == "pg":
        server = request.getfixturevalue("pg_server")
        url = await fresh_database(server)
    st = await open_store(StorageConfig(root=str(tmp_path / "history"), url=url))
    try:
        yield st, (pg_store, "message_of") if url else (json_store, "to_message")
    finally:
        await st.close()
        if url is not None:
            await drop_database(server, url)


async def test_the_store_stops_converting_messages_once_the_export_is_over_its_budget(store_and_converter,
                                                                                     monkeypatch):
    store, (module, name) = store_and_converter
    rec = await store.create("alice", "Big")
    for i in range(60):
        await store.append(rec.session_id, "user", f"{i} " + "z" * 500)
    whole = await store.export(rec.session_id, "json")
    assert [m["id"] for m in orjson.loads(whole)["messages"]] == list(range(1, 61))
    assert await store.export(rec.session_id, "json", max_bytes=wire_size(whole)) == whole
    counted = _Counted(getattr(module, name))
    monkeypatch.setattr(module, name, counted)
    with pytest.raises(ExportTooLarge) as err:
        await store.export(rec.session_id, "markdown", max_bytes=5000)
    assert err.value.code == "MESSAGE_TOO_LARGE" and err.value.total == 60 and err.value.done < 10
    assert counted.calls <= 11, counted.calls

"""Start-up with a knowledge base still loading: the server listens and answers PING (and chat) at
once, knowledge requests answer SERVER_BUSY "still loading" until the load ends; the garbage
collector's tuning (a full collection) runs before the listener opens, not while clients wait."""
from __future__ import annotations

import asyncio

import psutil

from protocol import MsgType
from server import app as app_module
from server import main as main_module
from server.app import Server
from server.knowledge.store import FileDocumentStore
from testkit.server import ReplyError, V3Client, make_config, poll, running_server


async def test_the_port_answers_ping_while_the_knowledge_base_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(app_module, "KNOWLEDGE_LOAD_WAIT_S", 0.0)
    gate = asyncio.Event()
    load = FileDocumentStore.load

    async def slow_load(self, each):          # a knowledge base that takes as long as the test says
        await gate.wait()
        await load(self, each)
    monkeypatch.setattr(FileDocumentStore, "load", slow_load)
    server = running_server(tmp_path)
    try:
        srv, addr = await asyncio.wait_for(server.__aenter__(), 10)   # (the old start waited for the load)
        c = await V3Client.connect(addr)
        try:
            pong = await c.request(MsgType.PING, id="p1")
            assert pong.type == MsgType.PONG and not srv.knowledge_loaded.done()
            for msg_type, body in ((MsgType.KB_LIST, {}), (MsgType.KB_SEARCH, {"query": "nginx"})):
                try:
                    await c.call(msg_type, **body)
                except ReplyError as exc:
                    assert exc.code == "SERVER_BUSY" and "still loading" in exc.body["message"]
                else:
                    raise AssertionError(f"{msg_type!r} answered while the knowledge base was loading")
            gate.set()
            await asyncio.wait_for(asyncio.shield(srv.knowledge_loaded), 10)
            assert (await c.call(MsgType.KB_LIST))["documents"] == []
        finally:
            await c.close()
    finally:
        gate.set()
        await server.__aexit__(None, None, None)


async def test_chat_turns_run_while_the_knowledge_base_loads(tmp_path, monkeypatch):
    """The offline agent asks whether the user has documents on every turn: while the knowledge base
    loads, a turn is answered (a documents question says the base is still loading) instead of
    failing SERVER_BUSY as a whole."""
    monkeypatch.setattr(app_module, "KNOWLEDGE_LOAD_WAIT_S", 0.0)
    gate = asyncio.Event()
    load = FileDocumentStore.load

    async def slow_load(self, each):
        await gate.wait()
        await load(self, each)
    monkeypatch.setattr(FileDocumentStore, "load", slow_load)
    srv = Server(make_config(tmp_path))                   # the embedded offline agent
    addr = await asyncio.wait_for(srv.start(), 10)
    c = await V3Client.connect(addr)
    try:
        for text in ("现在几点", "search my documents for the nginx port"):
            reply = await c.call(MsgType.CHAT_TEXT, text=text)
            events = await c.turn_events(reply["turn_id"], timeout=30)
            assert events[-1].type == MsgType.TURN_END, (text, events[-1].body)
            assert not srv.knowledge_loaded.done()
    finally:
        gate.set()
        await c.close()
        await srv.stop()


def _listening_ports() -> set[int]:
    """The TCP ports this process listens on (the server runs in it)."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


async def test_tune_gc_runs_before_the_listener_opens(tmp_path, monkeypatch):
    cfg = make_config(tmp_path)                # port 0: no port chosen and let go first (another worker may take it)
    before = _listening_ports()
    seen: list[bool] = []

    def tune(_threshold: int) -> None:
        seen.append(bool(_listening_ports() - before))                   # listening already?
        started.set()
    monkeypatch.setattr(main_module, "tune_gc", tune)
    monkeypatch.setattr(main_module, "freeze_young", lambda: None)
    started, stop = asyncio.Event(), asyncio.Event()
    port_file = tmp_path / "port"
    serving = asyncio.create_task(main_module.serve(cfg, str(port_file), stop))
    try:
        await asyncio.wait_for(started.wait(), 10)
        await poll(lambda: port_file.exists() or serving.done(), 10, "the port file")   # it comes last
        assert int(port_file.read_text().strip()) in _listening_ports() - before     # the port it listens on
    finally:
        stop.set()
        await asyncio.wait_for(serving, 20)
    assert seen == [False]

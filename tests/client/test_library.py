"""The asyncio client library against a real in-process server on 127.0.0.1:0."""
from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from client import errors
from client import kb as kbclient
from client.config import TlsConfig
from client.connection import Backoff, Client
from client.errors import ClientError
from client.events import Connected, Disconnected, Reconnecting
from client.link import Link
from protocol import ErrorCode, MsgType
from protocol.replies import ChatSendReply
from protocol.server_events import (AnswerDelta, SessionEvent, ToolCallEvent, ToolResultEvent, TurnEnd, TurnError,
                                    TurnEvent, TurnStart)
from client_testlib import next_event_of, v3_server, wait_until
from testkit.server import poll, running_server

CERTS = Path(__file__).parent / "certs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_turn(client: Client, text: str) -> tuple[ChatSendReply, list[TurnEvent]]:
    """Send a message; return the reply and every event of its turn (through TURN_END/TURN_ERROR)."""
    reply = await client.chat_send(text)
    events = []
    while True:
        ev = await next_event_of(client, TurnEvent, pred=lambda e: e.turn_id == reply.turn_id)
        events.append(ev)
        if isinstance(ev, (TurnEnd, TurnError)):
            return reply, events


async def test_hello_and_session_operations(client: Client) -> None:
    first = client.session_id           # the fixture's SESSION_NEW: HELLO gave none on a fresh server
    assert client.hello.proto == 3 and client.hello.session is None and first is not None
    created = await client.session_new(title="second")
    assert created.session.title == "second"
    assert client.session_id == created.session.session_id != first
    listed = await client.session_list()
    assert {s.session_id for s in listed.sessions} >= {first, client.session_id}
    renamed = await client.session_rename("renamed title")
    assert renamed.session.title == "renamed title"
    info = await client.session_info()
    assert info.session.title == "renamed title" and info.session.summary is None
    switched = await client.session_switch(first)
    assert switched.session.session_id == first == client.session_id
    assert switched.running_turn is None
    deleted = await client.session_delete(first)
    assert deleted.session_id == first
    assert client.session_id == deleted.current.session_id != first
    assert first not in {s.session_id for s in (await client.session_list()).sessions}


async def test_a_first_message_creates_the_session_and_hello_then_attaches_to_it(server) -> None:
    _, (host, port) = server
    async with Client(host, port) as c:
        assert c.hello is not None and c.hello.session is None and c.session_id is None
        assert (await c.session_list()).sessions == ()
        assert (await c.model_list()).current == "echo"
        reply, _ = await run_turn(c, "the first message")
        assert c.session_id == reply.session_id
        again = await c.chat_send("a new topic", new_session=True)
        assert c.session_id == again.session_id != reply.session_id
    async with Client(host, port) as c:
        assert c.hello is not None and c.hello.session is not None
        assert c.hello.session.session_id == c.session_id == again.session_id     # the newest


async def test_chat_events_in_order_with_contiguous_deltas(client: Client) -> None:
    reply, events = await run_turn(client, "!tool hello there")
    assert reply.user_message.content == "!tool hello there" and reply.queued == 0
    types = [type(e) for e in events]
    assert types[0] is TurnStart and types[-1] is TurnEnd
    assert types.index(ToolCallEvent) < types.index(ToolResultEvent) < types.index(AnswerDelta)
    text = ""
    for e in events:
        if isinstance(e, AnswerDelta):
            assert e.offset == len(text)
            text += e.text
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.message is not None
    assert end.message.content == text == "echo: !tool hello there"
    assert end.finish_reason == "stop"
    assert end.message.tool_calls[0].tool_name == "fake_tool"
    page = await client.history_page(limit=10)
    assert [m.role for m in page.messages] == ["user", "assistant"] and page.total == 2


async def test_history_paging_search_export_models_stats(client: Client) -> None:
    for i in range(3):
        await run_turn(client, f"note {i} about zebras")
    page = await client.history_page(limit=4)
    assert len(page.messages) == 4 and page.has_more is True
    older = await client.history_page(before=page.next_before, limit=4)
    assert [m.id for m in older.messages] == [1, 2] and older.has_more is False
    hits = (await client.search("zebras")).hits
    assert hits and all(h.session_id == client.session_id for h in hits)
    md = await client.export("markdown")
    assert md.format == "markdown" and "zebras" in md.content
    js = await client.export("json")
    assert "zebras" in json.dumps(json.loads(js.content))
    models = await client.model_list()
    assert [m.name for m in models.models] == ["echo", "echo-large"]
    assert (await client.model_switch("echo-large")).model == "echo-large"
    stats = await client.stats()
    assert stats.clients >= 1 and stats.turns_total >= 3
    pong = await client.ping()
    assert pong.time


@pytest.mark.parametrize("call, code", [
    (lambda c: c.session_switch("s_20260101_000000000000"), "NOT_FOUND"),
    (lambda c: c.history_page(limit=100000), "INVALID_MESSAGE"),
    (lambda c: c.chat_cancel(), "NO_ACTIVE_TURN"),
    (lambda c: c.model_switch("no-such-model"), "UNKNOWN_MODEL"),
    (lambda c: c.chat_send(""), "INVALID_MESSAGE"),
    (lambda c: c.session_rename(""), "INVALID_MESSAGE"),
])
async def test_error_replies_raise_client_error(client: Client, call, code: str) -> None:
    with pytest.raises(ClientError) as info:
        await call(client)
    assert info.value.code == code and info.value.message
    assert await client.ping()  # the connection stays usable


async def test_cancel_running_turn(client: Client, echo) -> None:
    reply = await client.chat_send("!block wait for it")
    await echo.wait_blocked(1)
    cancelled = await client.chat_cancel(turn_id=reply.turn_id)
    assert cancelled.cancelled is True
    end = await next_event_of(client, TurnEnd, pred=lambda e: e.turn_id == reply.turn_id)
    assert end.finish_reason == "cancelled"
    assert end.message.metadata["partial"] is True and end.message.partial


async def test_turn_error_event(client: Client) -> None:
    _, events = await run_turn(client, "!fail now")
    assert isinstance(events[-1], TurnError) and events[-1].code is ErrorCode.LLM_ERROR


async def test_fragmented_reply_larger_than_a_frame(client: Client) -> None:
    await run_turn(client, "!big 200000")
    reply = await client.export("markdown")
    assert reply.content.count("x") >= 200000


async def test_other_client_sees_session_events(server) -> None:
    _, (host, port) = server
    async with Client(host, port) as a, Client(host, port) as b:
        await a.session_new()             # a fresh server: HELLO gave no session
        await a.session_rename("from a")
        ev = await next_event_of(b, SessionEvent, pred=lambda e: e.kind == "renamed")
        assert ev.session.title == "from a"


async def test_connection_refused() -> None:
    c = Client("127.0.0.1", free_port(), reconnect=False)
    with pytest.raises(ClientError) as info:
        await c.connect()
    assert info.value.code == errors.CONNECTION_REFUSED and info.value.is_connection_error
    with pytest.raises(ClientError) as info:
        await c.ping()
    assert info.value.code == errors.NOT_CONNECTED


async def test_auth(tmp_path: Path) -> None:
    async with v3_server(tmp_path, users=[("alice", "token-a")]) as (_, (host, port)):
        with pytest.raises(ClientError) as info:
            await Client(host, port, token="wrong").connect()
        assert info.value.code == "AUTH_FAILED" and info.value.fatal
        async with Client(host, port, token="token-a") as c:
            assert c.hello.user == "alice"


async def test_tls(tmp_path: Path) -> None:
    cert, key = str(CERTS / "cert.pem"), str(CERTS / "key.pem")
    async with v3_server(tmp_path, tls_cert=cert, tls_key=key) as (_, (host, port)):
        async with Client(host, port, tls=TlsConfig(ca_file=cert).context()) as c:
            assert (await c.ping()).re
        async with Client(host, port, tls=TlsConfig(insecure=True).context()) as c:
            assert (await c.ping()).re
        with pytest.raises(ClientError) as info:
            await Client(host, port, tls=TlsConfig(enabled=True).context(), reconnect=False).connect()
        assert info.value.code == errors.TLS_ERROR


async def test_server_pings_are_answered(tmp_path: Path) -> None:
    async with v3_server(tmp_path, ping_interval_s=0.05, idle_timeout_s=0.3) as (srv, (host, port)):
        async with Client(host, port) as c:
            receiver = next(iter(srv.connections)).codec.receiver
            first = receiver.rx_seq         # counts the frames the client sends (PONGs) while idle
            await wait_until(lambda: (receiver.rx_seq - first) % 65536 >= 8, timeout=10,
                             what="PONGs past the idle timeout")
            assert c.connected and (await c.ping()).re


async def test_bounded_queue_applies_backpressure_without_loss(server) -> None:
    _, (host, port) = server
    async with Client(host, port, event_queue_size=16) as c:
        reply = await c.chat_send("!tokens 400")
        await wait_until(lambda: c.link._queue.qsize() >= 16, what="a full queue")
        assert c.link._queue.qsize() == 16  # bounded: the reader waits instead of growing the queue
        text = ""
        while True:
            ev = await next_event_of(c, (AnswerDelta, TurnEnd), pred=lambda e: e.turn_id == reply.turn_id)
            if isinstance(ev, TurnEnd):
                break
            assert ev.offset == len(text)
            text += ev.text
        assert text == "tok " * 400


async def test_close_ends_events_and_fails_requests(client: Client) -> None:
    await client.close()
    assert [e async for e in client.events() if isinstance(e, TurnStart)] == []
    with pytest.raises(ClientError) as info:
        await client.ping()
    assert info.value.code == errors.NOT_CONNECTED


async def test_reconnect_after_restart_restores_session(tmp_path: Path) -> None:
    port = free_port()
    async with v3_server(tmp_path, port=port) as (_, (host, _p)):
        c = Client(host, port, backoff=Backoff(initial=0.05, maximum=0.2, jitter=0.0))
        await c.connect()
        await c.session_new(title="keep me")
        sid = c.session_id
        reply = await c.chat_send("remember this")
        await next_event_of(c, TurnEnd, pred=lambda e: e.turn_id == reply.turn_id)
    try:
        ev = await next_event_of(c, Reconnecting)
        assert ev.attempt == 1
        with pytest.raises(ClientError) as info:
            await c.ping()
        assert info.value.code == errors.NOT_CONNECTED
        async with v3_server(tmp_path, port=port):
            ev = await next_event_of(c, Connected)
            assert ev.reconnected is True
            assert ev.hello.session_restored is True
            assert ev.hello.session.session_id == sid == c.session_id
            page = await c.history_page()
            assert [m.content for m in page.messages][0] == "remember this"
    finally:
        await c.close()


async def test_a_session_deleted_elsewhere_is_not_asked_for_again_on_reconnect(tmp_path: Path) -> None:
    """Another client deletes this client's session: the server moves the connection to the newest
    remaining session without naming it. The library forgets the deleted id, so a reconnect attaches
    to the newest session, and the next message goes there, not into the trash."""
    port = free_port()
    async with v3_server(tmp_path, port=port) as (_, (host, _p)):
        a = Client(host, port, backoff=Backoff(initial=0.05, maximum=0.2, jitter=0.0))
        await a.connect()
        keep = (await a.session_new(title="keep")).session.session_id
        doomed = (await a.session_new(title="doomed")).session.session_id
        assert a.session_id == doomed
        async with Client(host, port, reconnect=False) as b:
            await b.session_delete(doomed)
        ev = await next_event_of(a, SessionEvent, pred=lambda e: e.kind == "deleted")
        assert ev.session.session_id == doomed
        assert a.session_id is None
    try:
        await next_event_of(a, Reconnecting)
        async with v3_server(tmp_path, port=port):
            ev = await next_event_of(a, Connected)
            assert ev.hello.session is not None and ev.hello.session.session_id == keep
            reply = await a.chat_send("where does this go?")
            assert reply.session_id == keep == a.session_id
    finally:
        await a.close()


async def test_gives_up_after_max_attempts(tmp_path: Path) -> None:
    async with v3_server(tmp_path) as (_, (host, port)):
        c = Client(host, port, backoff=Backoff(initial=0.01, maximum=0.02, max_attempts=2))
        await c.connect()
    states = [type(e) async for e in c.events() if isinstance(e, (Connected, Reconnecting, Disconnected))]
    assert states == [Connected, Reconnecting, Reconnecting, Disconnected]
    assert c.state == "disconnected"
    await c.close()


async def test_a_request_over_the_servers_max_message_size_fails_at_once(tmp_path: Path) -> None:
    # the server discards such a message unread (it cannot know the request id): fail it locally
    async with v3_server(tmp_path, max_message_size=65535) as (_, (host, port)):
        async with Client(host, port, request_timeout=30) as c:
            with pytest.raises(ClientError) as info:
                await c.chat_send("中" * 30000)  # 90 KB of UTF-8
            assert info.value.code == "MESSAGE_TOO_LARGE" and "65535" in info.value.message
            assert (await c.chat_send("short")).user_message.content == "short"  # still usable


async def test_a_client_served_as_v2_after_a_late_hello_connects_again_at_once(tmp_path: Path, monkeypatch) -> None:
    """A server that hears nothing for ``legacy_grace_ms`` serves the connection as v2 and welcomes
    it with v2 text (docs/protocol.md §2). A client whose HELLO came that late (its loop stalled
    after the connect) takes that text as the sign, drops the connection and makes a new one at
    once, instead of waiting out its connect timeout for a HELLO reply that never comes."""
    async with running_server(tmp_path, legacy_grace_ms=50) as (srv, (host, port)):
        stalled: list[int] = []
        original = Link._send

        async def send(self: Link, msg_type: MsgType | int, body: dict) -> None:
            if msg_type == MsgType.HELLO and not stalled:    # the first HELLO only: after the welcome
                stalled.append(1)
                await poll(lambda: any(c.legacy is not None and c.legacy.idle for c in srv.connections),
                           timeout=10)
            await original(self, msg_type, body)
        monkeypatch.setattr(Link, "_send", send)
        c = Client(host, port, connect_timeout=5)
        try:
            hello = await c.connect()
            assert stalled and hello.proto == 3 and c.state == "connected"
            assert (await c.ping()).re is not None
            await poll(lambda: [x.ready for x in srv.connections] == [True], timeout=10)   # the v2 one is gone
        finally:
            await c.close()


# -- TLS mismatches: said plainly, and never retried ---------------------------------------------------
async def test_tls_mismatches_say_which_end_speaks_tls(tmp_path: Path) -> None:
    cert, key = str(CERTS / "cert.pem"), str(CERTS / "key.pem")
    async with v3_server(tmp_path / "plain") as (_, (host, plain)), \
            v3_server(tmp_path / "tls", tls_cert=cert, tls_key=key) as (_, (_, tls)):
        with pytest.raises(ClientError) as info:         # --tls against a plain port: reset in the handshake
            await Client(host, plain, tls=TlsConfig(enabled=True, ca_file=cert).context(), reconnect=False).connect()
        assert info.value.code == errors.TLS_ERROR
        assert "the server does not speak TLS on this port (drop --tls), or it refused the connection before the " \
            "handshake (full" in info.value.message
        assert "()" not in info.value.message and "Error" in info.value.message   # the error class, not ""
        with pytest.raises(ClientError) as info:         # plain against a TLS port: the HELLO is never answered
            await Client(host, tls, reconnect=False).connect()
        assert info.value.code == errors.TLS_ERROR and "the server expects TLS (use --tls)" in info.value.message
        with pytest.raises(ClientError) as info:         # a certificate nobody vouches for
            await Client(host, tls, tls=TlsConfig(enabled=True).context(), reconnect=False).connect()
        assert info.value.code == errors.TLS_ERROR and "not trusted: self-signed certificate" in info.value.message
    # none of them is retried: the TUI's first connect and the reconnect loop stop on these codes
    assert {errors.TLS_ERROR, ErrorCode.AUTH_FAILED} <= errors.PERMANENT_CODES


async def test_a_plain_hello_answered_by_a_tls_alert_fails_at_once() -> None:
    """A TLS server that answers the plain HELLO with an alert record (0x15 0x03 ...)."""
    accepted = 0

    async def tls_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read(100)
        writer.write(bytes([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46]))   # alert: protocol_version
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(tls_only, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ClientError) as info:
            await Client("127.0.0.1", port, reconnect=False).connect()
    assert info.value.code == errors.TLS_ERROR and info.value.message.endswith("the server expects TLS (use --tls)")
    assert accepted == 1                                # certain at once: not tried again


async def test_one_connection_dropped_before_hello_is_tried_again_at_once(tmp_path: Path) -> None:
    """A server going down drops a connection or two unanswered: only the second drop in a row is
    taken for a TLS mismatch, so a single one is not a permanent failure."""
    async with v3_server(tmp_path) as (_, (host, port)):
        accepted = 0

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            if accepted == 1:               # the first connection is closed unanswered
                writer.close()
                return
            up_r, up_w = await asyncio.open_connection(host, port)
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)
        proxy = await asyncio.start_server(flaky, "127.0.0.1", 0)
        async with proxy:
            async with Client("127.0.0.1", proxy.sockets[0].getsockname()[1], reconnect=False) as c:
                assert (await c.ping()).re and accepted == 2


# -- knowledge-base download: FILE.part is resumed only for its own document -------------------------
DOC = b"".join(f"{i:06d} backup job finished, 0 errors\n".encode() for i in range(30_000))   # ~1 MB


def _offsets(c: Client) -> list[int]:
    """Record the offset of every KB_DOWNLOAD request ``c`` makes."""
    offsets: list[int] = []
    request = c.request

    async def recording(msg_type, body=None, timeout=None):
        if msg_type == MsgType.KB_DOWNLOAD:
            offsets.append(body["offset"])
        return await request(msg_type, body, timeout)
    c.request = recording  # type: ignore[method-assign]
    return offsets


class _CutAfter(dict):
    """``Client.taps`` that cuts the connection after ``frames`` download data frames (and drops
    what was already read after them), like a network failure in the middle of a download."""

    def __init__(self, client: Client, frames: int) -> None:
        super().__init__()
        self.client, self.frames = client, frames

    def __setitem__(self, key, tap):
        if key == MsgType.KB_DOWNLOAD_DATA:
            def cutting(payload):
                if self.frames <= 0:
                    return True
                self.frames -= 1
                if self.frames == 0:
                    self.client.link._writer.transport.abort()
                return tap(payload)
            return super().__setitem__(key, cutting)
        return super().__setitem__(key, tap)


async def _interrupted(host: str, port: int, doc_id: str, dest: Path) -> int:
    """A download of ``doc_id`` cut after two data frames; returns the size of the part it left."""
    async with Client(host, port, reconnect=False) as c:
        c.link.taps = _CutAfter(c, 2)
        with pytest.raises(ClientError) as info:
            await kbclient.download(c, doc_id, dest)
        assert info.value.code == errors.CONNECTION_LOST
    size = dest.with_name(dest.name + ".part").stat().st_size
    assert 0 < size < len(DOC)
    return size


async def test_download_resumes_its_own_part_and_starts_a_stale_one_over(tmp_path: Path) -> None:
    src = tmp_path / "backup.log"
    src.write_bytes(DOC)
    small = tmp_path / "runbook.md"
    small.write_bytes(b"# Runbook\n\nRestart the worker, then check the queue depth is below 100.\n")
    async with v3_server(tmp_path / "srv") as (_, (host, port)):
        async with Client(host, port) as c:
            doc = await kbclient.upload(c, src)
            book = await kbclient.upload(c, small)
        dest = tmp_path / "out" / "copy.log"
        dest.parent.mkdir()
        part = dest.with_name("copy.log.part")
        kept = await _interrupted(host, port, doc.doc_id, dest)
        async with Client(host, port) as c:          # run again: resumed where it stopped
            offsets = _offsets(c)
            await kbclient.download(c, doc.doc_id, dest)
        assert offsets == [kept] and dest.read_bytes() == DOC
        assert not part.exists() and list(dest.parent.iterdir()) == [dest]    # no part, no sidecar left
        # stale parts of unknown origin (another file's, by hand): longer, shorter, as long as the
        # document: never resumed; refused unless replace_part, then started over from 0
        for stale in (b"x" * (book.size + 27), b"x" * 10, b"x" * book.size):
            out = tmp_path / "out" / "rb3.md"
            out.with_name("rb3.md.part").write_bytes(stale)
            async with Client(host, port) as c:
                with pytest.raises(ClientError) as exc:
                    await kbclient.download(c, book.doc_id, out)
                assert exc.value.code == "FILE_EXISTS" and out.with_name("rb3.md.part").read_bytes() == stale
                offsets = _offsets(c)
                await kbclient.download(c, book.doc_id, out, replace_part=True)
            assert offsets == [0] and out.read_bytes() == small.read_bytes()
        # a part left by another document's download is not resumed for this one either
        kept = await _interrupted(host, port, doc.doc_id, dest)
        async with Client(host, port) as c:
            offsets = _offsets(c)
            await kbclient.download(c, book.doc_id, dest)
        assert offsets == [0] and dest.read_bytes() == small.read_bytes()


async def test_a_resumed_part_that_is_not_the_documents_start_is_started_over_once(tmp_path: Path) -> None:
    src = tmp_path / "backup.log"
    src.write_bytes(DOC)
    async with v3_server(tmp_path / "srv") as (_, (host, port)):
        async with Client(host, port) as c:
            doc = await kbclient.upload(c, src)
        dest = tmp_path / "copy.log"
        part = dest.with_name("copy.log.part")
        kept = await _interrupted(host, port, doc.doc_id, dest)
        part.write_bytes(b"X" * kept)                  # corrupted on disk: the md5 fails, then from 0
        async with Client(host, port) as c:
            offsets = _offsets(c)
            await kbclient.download(c, doc.doc_id, dest)
        assert offsets == [kept, 0] and dest.read_bytes() == DOC and not part.exists()
        kept = await _interrupted(host, port, doc.doc_id, dest)
        with part.open("ab") as f:                     # grown past the document: the server refuses the offset
            f.write(b"X" * len(DOC))
        async with Client(host, port) as c:
            offsets = _offsets(c)
            await kbclient.download(c, doc.doc_id, dest)
        assert offsets == [kept + len(DOC), 0] and dest.read_bytes() == DOC
        async with Client(host, port) as c:           # an unknown document leaves nothing behind
            with pytest.raises(ClientError) as info:
                await kbclient.download(c, "0" * 24, tmp_path / "none.md")
        assert info.value.code == ErrorCode.NOT_FOUND and sorted(p.name for p in tmp_path.iterdir()) == \
            ["backup.log", "copy.log", "srv"]

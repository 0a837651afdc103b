"""Run a real NPLT server in-process on 127.0.0.1:0, and a small raw v3 test client.

``running_server(tmp_path, agent=..., **overrides)`` is an async context manager yielding
``(server, (host, port))``. Overrides are config keys of [server] or [limits] (``max_clients=2``), plus
``users=[("alice", "token-a"), ...]``, ``storage={...}``, ``sections={"summarization": {...}}`` and ``memory`` (a memory object; default
BasicMemory so tests do not depend on the memory layer; pass ``memory="auto"`` for the real wiring).

``V3Client`` speaks v3 through protocol.Connection over asyncio streams: ``call`` sends a request
and returns the RESPONSE body (raising ``ReplyError`` for ERROR), ``wait_for`` and ``turn_events``
wait for pushed events with a deadline. HELLO answers ``session: null`` to a user without sessions;
``connect`` then sends SESSION_NEW and puts that session into ``hello["session"]`` so that tests
have a session to work in (``new_session=False`` keeps HELLO's reply as it is).
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from protocol import Connection, Message, MsgType, ProtocolError, Role
from server.app import Server
from server.auth import hash_token
from server.config import LimitsConfig, ServerConfig, ServerSection
from testkit.echo_agent import EchoAgent

_SERVER_KEYS = set(ServerSection.model_fields)
_LIMIT_KEYS = set(LimitsConfig.model_fields)
DEADLINE = 10.0


def make_config(tmp_path: Path, *, users: list[tuple[str, str]] | None = None,
                storage: dict | None = None, sections: dict | None = None, **overrides: Any) -> ServerConfig:
    d: dict[str, Any] = {"server": {"host": "127.0.0.1", "port": 0, "log_level": "warning"},
                         "limits": {}, "storage": {"root": str(tmp_path / "history"), "durability": "batched",
                                                   "batch_ms": 5, **(storage or {})}}
    for key, value in overrides.items():
        if key in _SERVER_KEYS:
            d["server"][key] = value
        elif key in _LIMIT_KEYS:
            d["limits"][key] = value
        else:
            raise KeyError(f"unknown override {key!r}")
    d.update(sections or {})
    if users:
        d["auth"] = {"users": [{"user_id": u, "token_sha256": hash_token(t)} for u, t in users]}
    return ServerConfig.from_dict(d, env={})


@asynccontextmanager
async def running_server(tmp_path: Path, agent: Any = None, *, memory: Any = None,
                         **overrides: Any) -> AsyncIterator[tuple[Server, tuple[str, int]]]:
    cfg = make_config(tmp_path, **overrides)
    srv = Server(cfg, agent=agent if agent is not None else EchoAgent(),
                 memory=None if memory == "auto" else (memory or "basic"))
    host, port = await srv.start()
    try:
        yield srv, (host, port)
    finally:
        await srv.stop()


class ReplyError(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('code')}: {body.get('message')}")
        self.body = body
        self.code = body.get("code")


class V3Client:
    """A raw v3 client for tests: requests by id, pushed events collected in ``inbox``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, auto_pong: bool = True) -> None:
        self.reader, self.writer = reader, writer
        self.codec = Connection(Role.CLIENT, max_message_size=64 << 20)
        self.inbox: list[Message] = []
        self.closed = asyncio.Event()
        self.protocol_error: ProtocolError | None = None
        self.auto_pong = auto_pong
        self.hello: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._removed = 0
        self._waiting: dict[Any, asyncio.Future] = {}
        self._cond = asyncio.Condition()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(cls, addr: tuple[str, int], *, token: str | None = None, session_id: str | None = None,
                      hello: bool = True, new_session: bool = True, **kw: Any) -> V3Client:
        reader, writer = await asyncio.open_connection(*addr)
        client = cls(reader, writer, **kw)
        if hello:
            body: dict[str, Any] = {"proto": 3, "client": "testkit/1"}
            if token is not None:
                body["token"] = token
            if session_id is not None:
                body["session_id"] = session_id
            try:
                client.hello = await client.call(MsgType.HELLO, **body)
                if client.hello.get("session") is None and new_session:
                    client.hello["session"] = (await client.call(MsgType.SESSION_NEW))["session"]
            except BaseException:          # (refused: its socket and read task go with it)
                await client.close()
                raise
        return client

    @property
    def session_id(self) -> str:
        assert self.hello.get("session") is not None, "HELLO gave no session (connect with new_session=True)"
        return self.hello["session"]["session_id"]

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    return
                for ev in self.codec.receive_data(data):
                    await self._on_message(ev)
        except ProtocolError as exc:
            self.protocol_error = exc
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))
            async with self._cond:
                self._cond.notify_all()

    async def _on_message(self, msg: Any) -> None:
        if not isinstance(msg, Message):
            raise AssertionError(f"server sent an invalid message: {msg}")
        body = msg.body
        if msg.type in (MsgType.RESPONSE, MsgType.ERROR, MsgType.PONG):
            fut = self._waiting.pop(body.get("re"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
                return
        if msg.type == MsgType.PING and self.auto_pong:
            self.send(MsgType.PONG, {"re": body["id"], "time": "now"})
        async with self._cond:
            self.inbox.append(msg)
            self._cond.notify_all()

    # -- sending -------------------------------------------------------------------------------
    def send(self, msg_type: int, body: dict[str, Any]) -> None:
        self.writer.write(self.codec.send(msg_type, body))

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    def next_id(self) -> int:
        return next(self._ids)

    async def request(self, msg_type: int, timeout: float = DEADLINE, **body: Any) -> Message:
        """Send a request (an id is added unless given) and return the reply message."""
        rid = body.setdefault("id", self.next_id())
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self.send(msg_type, body)
        return await asyncio.wait_for(fut, timeout)

    async def call(self, msg_type: int, timeout: float = DEADLINE, **body: Any) -> dict[str, Any]:
        """The RESPONSE (or PONG) body; ReplyError on ERROR."""
        msg = await self.request(msg_type, timeout, **body)
        if msg.type == MsgType.ERROR:
            raise ReplyError(msg.body)
        return msg.body

    # -- receiving -----------------------------------------------------------------------------
    async def wait_for(self, pred: Callable[[Message], bool], timeout: float = DEADLINE) -> Message:
        """The first inbox message matching ``pred`` (removed from the inbox)."""
        async def waiter() -> Message:
            scanned, removed = 0, self._removed
            async with self._cond:
                while True:
                    if removed != self._removed:  # another waiter took messages: rescan
                        scanned, removed = 0, self._removed
                    for i in range(scanned, len(self.inbox)):
                        if pred(self.inbox[i]):
                            self._removed += 1
                            return self.inbox.pop(i)
                    scanned = len(self.inbox)
                    if self.closed.is_set():
                        raise ConnectionError("connection closed while waiting")
                    await self._cond.wait()
        return await asyncio.wait_for(waiter(), timeout)

    async def wait_type(self, msg_type: int, timeout: float = DEADLINE, **match: Any) -> Message:
        return await self.wait_for(lambda m: m.type == msg_type and all(m.body.get(k) == v for k, v in match.items()),
                                   timeout)

    async def turn_events(self, turn_id: str, timeout: float = DEADLINE) -> list[Message]:
        """Every event of one turn, in order, once its TURN_END or TURN_ERROR has arrived."""
        end = await self.wait_for(lambda m: m.type in (MsgType.TURN_END, MsgType.TURN_ERROR)
                                  and m.body.get("turn_id") == turn_id, timeout)
        events, rest = [], []
        for m in self.inbox:
            (events if isinstance(m.body, dict) and m.body.get("turn_id") == turn_id else rest).append(m)
        self.inbox = rest
        self._removed += 1
        return events + [end]

    async def wait_closed(self, timeout: float = DEADLINE) -> None:
        await asyncio.wait_for(self.closed.wait(), timeout)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


def answer_text(events: list[Message]) -> str:
    """The answer assembled from ANSWER_DELTA events (checking offsets are contiguous)."""
    text = ""
    for m in events:
        if m.type == MsgType.ANSWER_DELTA:
            assert m.body["offset"] == len(text), (m.body["offset"], len(text))
            text += m.body["text"]
    return text


async def poll(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll a condition (a function, or a coroutine function) with a deadline: no fixed sleeps.
    Returns the condition's first true value."""
    deadline = time.monotonic() + timeout
    while True:
        ok = pred()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return ok
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(0.01)


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """``poll`` for code that is not async (a test driving a server thread or a child process): the
    condition's first true value, or AssertionError after ``timeout``; the 10 ms between two looks is the
    poll interval of a condition with a deadline, not a synchronisation."""
    deadline = time.monotonic() + timeout
    while not (ok := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.01)
    return ok


async def non_reading_client(addr: tuple[str, int]) -> V3Client:
    """A v3 client past HELLO that then never reads (a 4 KiB receive buffer fills at once)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, addr)
    reader, writer = await asyncio.open_connection(sock=sock)
    slow = V3Client(reader, writer)
    await slow.call(MsgType.HELLO, proto=3, client="slow")
    slow._task.cancel()  # stop reading entirely
    return slow


class FakePort:
    """A hub subscriber standing in for a connection in handler tests (no TCP): the typed events the
    hub delivers are kept in ``events`` as (type, event, mine, re)."""

    needs_session = False

    def __init__(self) -> None:
        self.user_id: str | None = None
        self.session_id: str | None = None
        self.closed = False
        self.events: list[tuple[int, Any, bool, Any]] = []
        self.moved: list[tuple[str, str]] = []

    def turn_event(self, out: Any, mine: bool, re: Any) -> None:
        self.events.append((out.type, out.event, mine, re))

    def event(self, out: Any) -> None:
        self.events.append((out.type, out.event, False, None))

    def session_moved(self, deleted_id: str, new_id: str) -> None:
        self.moved.append((deleted_id, new_id))

    def hold_events(self) -> None:
        """(Kept in order already: nothing is sent.)"""

    def of_type(self, msg_type: int) -> list[Any]:
        return [event for t, event, _, _ in self.events if t == msg_type]


@asynccontextmanager
async def handler_services(tmp_path: Path, agent: Any = None, *, store: Any = None,
                           **overrides: Any) -> AsyncIterator[Any]:
    """``server.services.Services`` over a real store in ``tmp_path`` (or ``store``), an EchoAgent and
    BasicMemory, without any listening socket; the turn runner is shut down and the store closed after."""
    from server.services import build_services
    from storage import AsyncHistoryStore
    cfg = make_config(tmp_path, **overrides)
    own = store is None
    if own:
        store = await AsyncHistoryStore.open(cfg.storage)

    def notify(kind: str, session_id: str, payload: Any = None) -> None:
        return None

    svc = build_services(cfg, store, notify, agent=agent if agent is not None else EchoAgent(), memory="basic")
    try:
        yield svc
    finally:
        await svc.runner.shutdown(timeout=5)
        await store.close()


async def hello_context(svc: Any, port: FakePort | None = None) -> Any:
    """A RequestContext after a successful HELLO (user ``local``, attached to a session: the user's
    newest, else a new one made with SESSION_NEW, as ``V3Client.connect`` does)."""
    from protocol.messages import SessionNew
    from server.context import RequestContext
    from server.handlers.hello import handle_hello, parse_hello
    from server.handlers.sessions import session_new
    ctx = RequestContext(svc, port or FakePort())
    await handle_hello(ctx, parse_hello({"id": 1, "proto": 3, "client": "testkit/1"}))
    if ctx.session_id is None:
        await session_new(ctx, SessionNew(id=0))
    return ctx

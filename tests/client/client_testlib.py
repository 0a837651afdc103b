"""Helpers for client tests: agents, a server in a background thread, history pre-fill, polling waits."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from client.config import ClientConfig
from client.connection import Client
from client.tui.app import NpltApp
from client.tui.chat import ChatView
from client.tui.input import ChatInput
from client.tui.knowledge import KnowledgeOps, KnowledgeScreen
from testkit.echo_agent import EchoAgent
from testkit.server import running_server

DEADLINE = 15.0


#: The clients of these tests speak v3 only, and a v3 client that sends its HELLO more than
#: ``legacy_grace_ms`` (300 ms by default) after connecting is served as v2 (docs/protocol.md §2):
#: its HELLO then goes unanswered. In one pytest process the server shares the loop with the client
#: (and with Textual), so a stall of the loop between the accept and the HELLO (a full garbage
#: collection of a long run's heap, an app mounting) would do that. Seen twice in full runs.
V3_ONLY = {"legacy_grace_ms": 60_000}


def v3_server(tmp_path: Path, agent: Any = None, **overrides: Any) -> Any:
    """``running_server`` for v3 clients only (``V3_ONLY``)."""
    return running_server(tmp_path, agent, **{**V3_ONLY, **overrides})


def offline_agent() -> Any:
    """The real OfflineAgent with the real (read-only) tools."""
    from server.agent.config import AgentConfig
    from server.agent.offline import OfflineAgent
    from server.tools import ToolRegistry
    from server.tools.config import ToolsConfig
    return OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig()))


async def prefill(srv: Any, session_id: str, n: int, *, start: int = 0) -> None:
    """Append ``n`` alternating user/assistant messages to a session through the server's store."""
    def fill() -> None:
        for i in range(start, start + n):
            srv.store.sync.append(session_id, "user" if i % 2 == 0 else "assistant", f"message number {i}")
    await asyncio.to_thread(fill)


async def wait_until(pred: Callable[[], bool], *, pilot: Any = None, timeout: float = DEADLINE,
                     what: str = "condition") -> None:
    """Poll ``pred`` (letting the app process messages through ``pilot.pause()``) until true or the deadline."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if pilot is not None:
            await pilot.pause(0.01)
        else:
            await asyncio.sleep(0.01)


async def next_event_of(client: Any, types: type | tuple[type, ...], timeout: float = DEADLINE,
                        pred: Callable[[Any], bool] | None = None) -> Any:
    """The next client event that is an instance of ``types`` (and matches ``pred``), skipping others."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {types} event in time")
        ev = await client.next_event(timeout=left)
        if ev is None:
            raise AssertionError("client closed while waiting for an event")
        if isinstance(ev, types) and (pred is None or pred(ev)):
            return ev


class ServerThread:
    """A real server running in its own event loop in a background thread (for sync tests:
    subprocess CLI runs and snapshot tests, whose App.run() owns the main thread's loop)."""

    def __init__(self, tmp_path: Path, agent_factory: Callable[[], Any] = EchoAgent, **overrides: Any) -> None:
        # The app under test sends HELLO only once Textual has mounted it, which on a loaded machine can
        # take longer than the default 300 ms grace after which a silent socket is served as v2 (the
        # app then got the v2 welcome: "INVALID_JSON: CHAT_TEXT payload..."). These clients are v3.
        overrides = {**V3_ONLY, **overrides}
        self.tmp_path, self.agent_factory, self.overrides = tmp_path, agent_factory, overrides
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="nplt-test-server", daemon=True)
        self.srv: Any = None
        self.addr: tuple[str, int] = ("127.0.0.1", 0)
        self._stop: asyncio.Event | None = None
        self._done: Future[None] | None = None

    def __enter__(self) -> ServerThread:
        self.thread.start()
        ready: Future[None] = Future()

        async def serve() -> None:
            self._stop = asyncio.Event()
            try:
                async with running_server(self.tmp_path, agent=self.agent_factory(), **self.overrides) as (srv, addr):
                    self.srv, self.addr = srv, addr
                    ready.set_result(None)
                    await self._stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise
        self._done = asyncio.run_coroutine_threadsafe(serve(), self.loop)
        ready.result(DEADLINE)
        return self

    def run(self, coro: Awaitable[Any]) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE)

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._done is not None:
            self._done.result(DEADLINE)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE)
        self.loop.close()


# ---------------------------------------------------------------- the TUI under Pilot
SIZE = (110, 40)


@asynccontextmanager
async def open_app(addr: tuple[str, int], *, with_session: bool = True,
                   **cfg: Any) -> AsyncIterator[tuple[NpltApp, Any]]:
    """Run the app on the server and wait until it shows a session. A user without sessions gets
    none from HELLO (the first message creates it): ``with_session`` first makes one (an empty "New
    chat", as HELLO used to), else the app is only waited for until it is connected."""
    if with_session:
        async with Client(*addr) as c:
            if c.session_id is None:
                await c.session_new()
    config = ClientConfig(host=addr[0], port=addr[1], reconnect_initial_s=0.05, reconnect_max_s=0.2, **cfg)
    app = NpltApp(config)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: app.client.connected and app.controller._loads == 0
                         and (app.query_one(ChatView).session_id is not None or not with_session),
                         pilot=pilot, what="the first session")
        yield app, pilot


def chat(app: NpltApp) -> ChatView:
    return app.query_one(ChatView)


async def type_and_send(pilot: Any, text: str) -> None:
    """Put text in the input and press Enter (typing key by key is covered in the recall test)."""
    box = pilot.app.query_one(ChatInput)
    box.focus()
    box.load_text(text)
    await pilot.press("enter")


def shown(app: Any, screen_type: type) -> bool:
    """``screen_type`` is on top and mounted with its widgets (pushed is not yet composed: a query
    right after the push can find nothing)."""
    screen = app.screen
    return isinstance(screen, screen_type) and screen.is_mounted and bool(screen.children)


async def push_download_panel(app: Any, pilot: Any, folder: Path, listing: Callable[[], Awaitable[Any]],
                              download: Callable[..., Awaitable[Any]]) -> KnowledgeScreen:
    """A Knowledge panel over scripted ``listing`` and ``download`` operations (the others must not
    be called), pushed onto the running ``app``, loaded, its table focused."""
    from textual.widgets import DataTable

    async def unused(*_args: Any) -> Any:
        raise AssertionError("not called")
    panel = KnowledgeScreen(KnowledgeOps(listing, unused, download, unused, folder))
    await app.push_screen(panel)
    await wait_until(lambda: panel.loaded, pilot=pilot, what="the panel")
    panel.query_one("#kb-table", DataTable).focus()
    return panel

"""The TUI's brain: owns the Client, turns server events into widget updates, runs session operations.

Rules that keep it correct:
- The event loop (``run``) never waits for a request's reply: operations run as workers, so a
  full event queue can never block a reply (see client.events).
- While a session is being (re)loaded, turn events are deferred and replayed after the page is
  shown; messages are deduplicated by id, and a reattached turn drops deltas it already shows.
- Deltas are coalesced (see client.tui.batch): taking an ANSWER_DELTA drains the events already
  queued, and each run of consecutive deltas of one turn is rendered with a single append.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from textual.css.query import NoMatches

from client.connection import Backoff, Client
from client.errors import PERMANENT_CODES, ClientError
from client.events import Event
from client.tui.batch import drain, runs
from client.tui.chat import ChatView
from client.tui.sidebar import Sidebar
from client.tui.status import StatusLine
from client.tui.turn_events import TurnEvents, _now

if TYPE_CHECKING:
    from client.tui.app import NpltApp

SESSION_KINDS_RELOAD = frozenset({"cleared"})


class Controller(TurnEvents):
    def __init__(self, app: NpltApp, client: Client) -> None:
        self.app, self.client, self.cfg = app, client, app.config
        self.session: dict[str, Any] | None = None
        self.models: list[dict[str, Any]] = []
        self.deferred: list[Event] = []
        self._loads = 0
        self._load_lock = asyncio.Lock()
        self._deleting: set[str] = set()

    # -- widgets ----------------------------------------------------------------------------------------
    @property
    def chat(self) -> ChatView:
        return self.app.query_one(ChatView)

    @property
    def sidebar(self) -> Sidebar:
        return self.app.query_one(Sidebar)

    @property
    def status(self) -> StatusLine:
        return self.app.query_one(StatusLine)

    @property
    def session_id(self) -> str | None:
        return self.session["session_id"] if self.session else None

    @property
    def page_size(self) -> int:
        """The configured page size, capped by the server's ``max_page_size``."""
        limits = (self.client.hello or {}).get("limits") or {}
        return min(self.cfg.page_size, int(limits.get("max_page_size") or self.cfg.page_size))

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run an operation as a worker; ClientErrors become inline errors / notifications."""
        async def guarded() -> None:
            try:
                await coro
            except ClientError as exc:
                await self.report(exc)
        self.app.run_worker(guarded(), name=name, group=name, exit_on_error=False)

    async def report(self, exc: ClientError) -> None:
        self.app.notify(f"{exc.code}: {exc.message}", severity="error", timeout=6)
        try:
            await self.chat.add_error(f"Error {exc.code}: {exc.message}")
        except NoMatches:  # the app is shutting down
            pass

    # -- connection -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect (retrying with backoff until it works), then consume events until closed."""
        backoff = Backoff(initial=self.cfg.reconnect_initial_s, maximum=self.cfg.reconnect_max_s)
        attempt = 0
        self.status.set_connection("connecting")
        while True:
            try:
                await self.client.connect()
                break
            except ClientError as exc:
                attempt += 1
                if exc.code in PERMANENT_CODES:
                    self.status.set_connection("disconnected", exc.code)
                    await self.chat.add_error(f"Cannot connect: {exc.code}: {exc.message}")
                    return
                self.status.set_connection("connecting", f"attempt {attempt}: {exc.code}")
                if attempt == 1:
                    await self.chat.add_error(f"Cannot connect: {exc.message} (retrying)")
                await asyncio.sleep(backoff.delay(attempt))
        while (event := await self.client.next_event()) is not None:
            batch, closed = [event], False
            if event.type == "ANSWER_DELTA":  # coalesce: take whatever else is already waiting
                closed = await drain(self.client, batch, self.cfg.event_queue_size)
            for run in runs(batch):
                try:
                    await self.handle(run)
                except Exception as exc:  # noqa: BLE001 - a rendering bug must not stop the event loop
                    self.app.log.error(f"event {run[0].type} failed: {exc!r}")
                    self.app.notify(f"Display error on {run[0].type}: {exc}", severity="error")
            if closed:
                return
            if len(batch) > 1:
                await asyncio.sleep(0)  # let the screen refresh and input run between batches

    async def on_turn_run(self, run: list[Event]) -> None:
        """Show a turn event, or a run of deltas of one turn, if it belongs to the shown session."""
        if run[0].session_id != self.chat.session_id:
            return
        if len(run) > 1:
            await self.on_deltas(run[0].turn_id or "", [e.body for e in run])
        else:
            await self.on_turn_event(run[0])

    async def handle(self, run: list[Event]) -> None:
        """Handle one event, or a run of consecutive ANSWER_DELTAs of one turn (see ``batch.runs``)."""
        event = run[0]
        t, body = event.type, event.body
        if t == "STATE":
            await self.on_state(body)
        elif t == "SESSION_EVENT":
            await self.on_session_event(event)
        elif t == "NOTICE":
            self.app.notify(str(body.get("message", "")), title=str(body.get("code", "")),
                            severity="warning" if body.get("level") == "warning" else "information")
        elif t in ("ERROR", "INVALID"):
            self.app.notify(f"{body.get('code')}: {body.get('message')}", severity="error")
        elif event.is_turn_event:
            if self._loads:
                self.deferred.extend(run)
            else:
                await self.on_turn_run(run)

    async def on_state(self, body: dict[str, Any]) -> None:
        state = body.get("state", "")
        if state == "connected":
            self.status.set_connection("connected")
            hello = body.get("hello") or {}
            self.app.agent_info = hello.get("agent") or {}
            self.spawn(self.after_connect(hello), "connect")
        elif state == "reconnecting":
            self.status.set_connection("reconnecting", f"attempt {body.get('attempt')}")
            self.status.set_turn(None)
        elif state == "disconnected":
            self.status.set_connection("disconnected", str(body.get("code", "")))
            self.status.set_turn(None)
            await self.chat.add_error(f"Disconnected: {body.get('error', '')}")

    async def after_connect(self, hello: dict[str, Any]) -> None:
        await self.load_session(lambda: self._hello_target(hello))
        # the sidebar and the model list come after the first paint of the chat
        self.app.call_after_refresh(lambda: self.spawn(self.load_lists(), "lists"))

    async def load_lists(self) -> None:
        await self.load_sessions()
        try:
            self.models = (await self.client.model_list()).get("models", [])
        except ClientError:
            self.models = []

    async def _hello_target(self, hello: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return hello["session"], hello.get("running_turn")

    async def load_sessions(self) -> None:
        sessions: list[dict[str, Any]] = []
        before = None
        while len(sessions) < self.cfg.sidebar_max_sessions:
            page = await self.client.session_list(before=before, limit=min(100, self.cfg.sidebar_max_sessions))
            sessions.extend(page.get("sessions", []))
            before = page.get("next_before")
            if not page.get("has_more") or not before:
                break
        if self.session and all(s["session_id"] != self.session_id for s in sessions):
            sessions.append(self.session)
        self.sidebar.set_sessions(sessions)

    # -- sessions ---------------------------------------------------------------------------------------
    async def load_session(self, fetch: Callable[[], Awaitable[tuple[dict[str, Any], dict[str, Any] | None]]]) -> None:
        """Fetch a session (switch/new/hello) and show its newest page; turn events wait meanwhile."""
        self._loads += 1
        try:
            async with self._load_lock:
                session, running = await fetch()
                self.session = session
                chat = self.chat
                await chat.reset(session["session_id"])
                self.sidebar.upsert(session)
                self.sidebar.set_current(session["session_id"])
                self.app.sub_title = session.get("title") or ""
                page = await self.client.history_page(session["session_id"], limit=self.page_size)
                await chat.show_page(page)
                self.status.set_turn(None)
                if running:
                    await self.attach(running)
                chat.call_after_refresh(chat.check_top)
        finally:
            try:
                while self.deferred and self._loads == 1:
                    batch, self.deferred = self.deferred, []
                    for run in runs(batch):
                        await self.on_turn_run(run)
            finally:
                self._loads -= 1

    async def attach(self, turn: dict[str, Any]) -> None:
        """Reattach to a running turn: show its content so far; later deltas below that length are dropped."""
        chat = self.chat
        if turn.get("user_message"):
            await chat.add_message(turn["user_message"])
        view = chat.live.get(turn["turn_id"])
        if view is None:
            await chat.add_message({"role": "assistant", "content": turn.get("content", ""),
                                    "timestamp": turn.get("started_at") or _now(),
                                    "tool_calls": turn.get("tool_calls") or []}, turn_id=turn["turn_id"])
        for queued in turn.get("queued") or ():
            await chat.add_pending(queued["turn_id"], queued["user_message"])
        self.status.set_turn(turn.get("status") or "thinking")

    async def switch(self, session_id: str) -> None:
        if session_id == self.session_id:
            return

        async def fetch() -> tuple[dict[str, Any], dict[str, Any] | None]:
            reply = await self.client.session_switch(session_id)
            return reply["session"], reply.get("running_turn")
        await self.load_session(fetch)

    async def new_session(self) -> None:
        async def fetch() -> tuple[dict[str, Any], dict[str, Any] | None]:
            return (await self.client.session_new())["session"], None
        await self.load_session(fetch)

    async def rename(self, title: str) -> None:
        reply = await self.client.session_rename(title, session_id=self.session_id)
        self._session_changed(reply["session"])

    async def delete(self, session_id: str) -> None:
        self._deleting.add(session_id)
        try:
            if session_id != self.session_id:
                await self.client.session_delete(session_id)
                self.sidebar.remove(session_id)
                return

            async def fetch() -> tuple[dict[str, Any], dict[str, Any] | None]:
                reply = await self.client.session_delete(session_id)
                self.sidebar.remove(session_id)
                return reply["current"], None
            await self.load_session(fetch)
        finally:
            self._deleting.discard(session_id)

    async def clear(self) -> None:
        async def fetch() -> tuple[dict[str, Any], dict[str, Any] | None]:
            return (await self.client.session_clear(self.session_id))["session"], None
        await self.load_session(fetch)

    def _session_changed(self, session: dict[str, Any]) -> None:
        self.sidebar.upsert(session)
        if session.get("session_id") == self.session_id:
            self.session = {**(self.session or {}), **session}
            self.app.sub_title = session.get("title") or ""

    async def on_session_event(self, event: Event) -> None:
        kind, session = event.body.get("kind"), event.body.get("session") or {}
        sid = session.get("session_id")
        if not sid:
            return
        if kind == "deleted":
            self.sidebar.remove(sid)
            if sid == self.session_id and sid not in self._deleting:
                self.app.notify("This session was deleted by another client", severity="warning")
                other = self.sidebar.newest_other(sid)
                self.spawn(self.switch(other) if other else self.new_session(), "session")
            return
        self._session_changed(session)
        if kind in SESSION_KINDS_RELOAD and sid == self.session_id and not self._loads:
            self.spawn(self.reload(), "session")

    async def reload(self) -> None:
        async def fetch() -> tuple[dict[str, Any], dict[str, Any] | None]:
            reply = await self.client.session_switch(self.session_id or "")
            return reply["session"], reply.get("running_turn")
        await self.load_session(fetch)

    async def load_older(self) -> None:
        chat = self.chat
        try:
            if not chat.has_more or chat.next_before is None or not chat.session_id:
                return
            sid = chat.session_id
            page = await self.client.history_page(sid, before=chat.next_before, limit=self.page_size)
            if chat.session_id == sid:
                await chat.prepend_page(page)
        finally:
            chat.loading_older = False
        chat.call_after_refresh(chat.check_top)

    async def jump_to(self, hit: dict[str, Any]) -> None:
        """Open the hit's session and load older pages until its message is shown, then scroll to it."""
        await self.switch(hit["session_id"])
        chat, mid = self.chat, int(hit["message_id"])
        await chat.settle()
        while mid not in chat.by_id and chat.has_more and chat.next_before is not None and chat.next_before > mid:
            page = await self.client.history_page(chat.session_id, before=chat.next_before, limit=self.page_size)
            await chat.prepend_page(page)
        await chat.settle()
        view = chat.by_id.get(mid)
        if view is None:
            self.app.notify(f"Message #{mid} is no longer in this session", severity="warning")
            return
        for other in chat.query(".-found"):
            other.remove_class("-found")
        view.add_class("-found")
        chat.call_after_refresh(lambda: chat.scroll_to_widget(view, animate=False, top=True))
        view.focus(scroll_visible=False)

    # -- chat -------------------------------------------------------------------------------------------
    async def send(self, text: str) -> None:
        if not self.client.connected:
            await self.chat.add_error(f"Not sent (connection {self.client.state}): {text[:60]}")
            return
        sid = self.chat.session_id
        reply = await self.client.chat_send(text)
        if self.chat.session_id == sid and reply.get("session_id") == sid:
            message, turn_id = reply["user_message"], reply.get("turn_id") or ""
            if message.get("id") is not None:
                await self.chat.add_message(message)
            elif turn_id not in self.chat.live:   # queued: stored when its turn starts
                await self.chat.add_pending(turn_id, message)
            if reply.get("queued") and not self.chat.live:
                self.status.set_turn("queued", f"{reply['queued']} ahead")

    async def cancel(self) -> None:
        live = list(self.chat.live)
        if not live:
            return
        try:
            await self.client.chat_cancel(session_id=self.chat.session_id, turn_id=live[-1])
        except ClientError as exc:
            if exc.code != "NO_ACTIVE_TURN":
                raise

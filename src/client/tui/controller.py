"""The TUI's I/O: owns the Client, feeds what the server says to ``ChatState``, runs session operations.

The decisions (what the chat shows, which turn is live or queued) are ``ChatState``'s; this module
only talks to the server and hands each ``Change`` to the widget that renders it. Rules that keep
it correct:
- The event loop (``run``) never waits for a request's reply: operations run as workers, so a
  full event queue can never block a reply (see client.events).
- While a session is being (re)loaded, turn events are deferred and replayed after the page is
  shown; messages are deduplicated by id, and a reattached turn drops deltas it already shows.
- Deltas are coalesced (see client.tui.batch): taking an ANSWER_DELTA drains the events already
  queued, and each run of consecutive deltas of one turn is rendered with a single append.
- A message is given back into the input only when it surely did not reach the server (no
  connection, or an ERROR reply); one whose fate is unknown (the link dropped before the reply, the
  reply timed out) is not (it could be sent twice): the next load of its session says whether the
  server has it.

It knows the app only as a Textual ``App`` (no import of client.tui.app: no cycle).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from textual.app import App
from textual.css.query import NoMatches

from protocol import ErrorCode, MsgType
from protocol.kb import KbDeleteReply, KbDocument, KbHit
from protocol.objects import AgentInfo, ChatMessage, ModelInfo, SearchHit, SessionInfo, TurnState
from protocol.replies import ChatSendReply
from protocol.server_events import AnswerDelta, Notice, SessionEvent, TurnEvent

from client import kb as kbclient
from client.config import ClientConfig
from client.connection import Backoff, Client
from client.errors import PERMANENT_CODES, ClientCode, ClientError
from client.events import Connected, Disconnected, Event, InvalidFrame, Reconnecting, ServerError
from client.tui.batch import drain, runs
from client.tui.chat import ChatView
from client.tui.input import ChatInput
from client.tui.knowledge import KnowledgeOps, Uploads
from client.tui.sidebar import Sidebar
from client.tui.state import Change, ChatState, StatusChanged
from client.tui.status import StatusLine
from client.wording import printable

SESSION_KINDS_RELOAD = frozenset({"cleared"})
# Operations whose failure belongs to the conversation: shown in the chat (and notified). Any other
# operation is a side action (rename, export, opening a passage, ...): its failure is a notification
# naming the action (ACTIONS), and the chat stays as it was.
CHAT_OPERATIONS = frozenset({"send", "redo", "cancel", "connect"})
ACTIONS = {"rename": "Rename", "session": "Session", "older": "Loading older messages",
           "prompt": "System prompt", "passage": "Opening the source", "export": "Export",
           "why": "Why this answer", "model": "Model switch", "lists": "Loading the sessions"}
# the session to show and its running turn; no session (None): the connection has none (§5.1, §5.2)
Fetch = Callable[[], Awaitable[tuple[SessionInfo | None, TurnState | None]]]
QUOTE_CHARS = 40   # how much of a message a notification about it quotes
# a regenerate or an edit asked for while an answer of the session runs: refused here, not sent
REDO_WHILE_LIVE = "An answer is running: Esc cancels it first"


@dataclass(frozen=True, slots=True)
class Unsure:
    """A message whose CHAT_TEXT got no reply (the link dropped, the reply timed out): the server may
    have it. ``after``: the newest stored message id shown when it was sent (a copy of it in the
    session is newer); ``session_id`` None: it was to create the session."""
    session_id: str | None
    text: str
    after: int


def quote(text: str) -> str:
    """A message, quoted in a notification (one line, cut)."""
    line = " ".join(text.split())
    return f"“{line if len(line) <= QUOTE_CHARS else line[:QUOTE_CHARS - 1] + '…'}”"


class Controller:
    def __init__(self, app: App[Any], client: Client, config: ClientConfig) -> None:
        self.app, self.client, self.cfg = app, client, config
        self.state = ChatState()
        self.agent: AgentInfo | None = None
        self.models: list[ModelInfo] = []
        self.deferred: list[Event] = []
        self._loads = 0
        self._load_lock = asyncio.Lock()
        self._deleting: set[str] = set()
        self._first_send = asyncio.Lock()   # one send at a time while no session exists yet
        self._unsure: list[Unsure] = []     # sent messages whose fate the next load of their session tells

        async def upload(path: Path, progress: Callable[[str, int, int], None]) -> KbDocument:
            return await kbclient.upload(client, path, progress=progress)
        self.uploads = Uploads(upload)   # knowledge-base uploads: they outlive the Knowledge panel

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
    def session(self) -> SessionInfo | None:
        return self.state.session

    @property
    def session_id(self) -> str | None:
        return self.state.session_id

    @property
    def page_size(self) -> int:
        """The configured page size, capped by the server's ``max_page_size``."""
        limits = self.client.hello.limits if self.client.hello is not None else {}
        return min(self.cfg.page_size, int(limits.get("max_page_size") or self.cfg.page_size))

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run an operation as a worker; a ClientError is shown in the chat for the conversation's
        operations (``CHAT_OPERATIONS``), else notified as the failure of that action."""
        async def guarded() -> None:
            try:
                await coro
            except ClientError as exc:
                if name in CHAT_OPERATIONS:
                    await self.report(exc)
                else:
                    self.app.notify(f"{ACTIONS.get(name, name.capitalize())} failed: {exc.message}",
                                    title=str(exc.code), severity="error", timeout=8)
        self.app.run_worker(guarded(), name=name, group=name, exit_on_error=False)

    async def report(self, exc: ClientError) -> None:
        """A conversation operation failed: notified, and shown inline in the chat, except for a
        request the server refused (an ERROR reply: QUEUE_FULL, ...) while an answer is running in
        this session: its line would be mounted under the live answer and stay there after the
        answer ends well, so the notification alone says it."""
        self.app.notify(f"{exc.code}: {exc.message}", severity="error", timeout=6)
        if isinstance(exc.code, ErrorCode) and self.state.live_turn is not None:
            return
        try:
            await self.chat.add_error(f"Error {exc.code}: {exc.message}")
        except NoMatches:  # the app is shutting down: the notification is all that can be shown
            self.app.log.warning(f"error not shown in the chat (closing): {exc}")

    def focus_input(self) -> None:
        """After a session operation the user asked for, typing goes to the message input."""
        try:
            self.app.query_one(ChatInput).focus()
        except NoMatches:  # the app is shutting down: nothing to focus
            self.app.log.debug("no input to focus")

    async def render(self, changes: list[Change]) -> None:
        """Hand ChatState's changes to the widgets, in order."""
        chat = self.chat
        for change in changes:
            if isinstance(change, StatusChanged):
                self.status.set_turn(change.status, change.detail)
            else:
                await chat.apply(change)

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
            if isinstance(event, AnswerDelta):  # coalesce: take whatever else is already waiting
                closed = await drain(self.client, batch, self.cfg.event_queue_size)
            for run in runs(batch):
                try:
                    await self.handle(run)
                except Exception as exc:  # noqa: BLE001 - a rendering bug must not stop the event loop
                    name = type(run[0]).__name__
                    self.app.log.error(f"event {name} failed: {exc!r}")
                    self.app.notify(f"Display error on {name}: {exc}", severity="error")
            if closed:
                return
            if len(batch) > 1:
                await asyncio.sleep(0)  # let the screen refresh and input run between batches

    async def on_turn_event(self, event: TurnEvent) -> None:
        """Show one turn event (ChatState ignores those of other sessions)."""
        await self.render(self.state.apply(event))

    async def on_turn_run(self, run: list[Event]) -> None:
        """A turn event, or a run of deltas of one turn (see ``batch.runs``)."""
        if len(run) > 1:
            await self.render(self.state.apply_deltas(run))  # type: ignore[arg-type]
        else:
            await self.on_turn_event(run[0])  # type: ignore[arg-type]

    async def handle(self, run: list[Event]) -> None:
        """Handle one event, or a run of consecutive ANSWER_DELTAs of one turn (see ``batch.runs``)."""
        event = run[0]
        match event:
            case TurnEvent():
                if self._loads:
                    self.deferred.extend(run)
                else:
                    await self.on_turn_run(run)
            case SessionEvent():
                await self.on_session_event(event)
            case Notice(level=level, code=code, message=message):
                self.app.notify(message, title=code, severity="warning" if level == "warning" else "information")
            case ServerError(error=error):
                self.app.notify(f"{error.code}: {error.message}", severity="error")
            case InvalidFrame(code=code, message=message):
                self.app.notify(f"{code}: {message}", severity="error")
            case Connected(hello=hello):
                self.status.set_connection("connected")
                self.agent = hello.agent
                self.spawn(self.after_connect(hello.session, hello.running_turn), "connect")
            case Reconnecting(attempt=attempt):
                self.status.set_connection("reconnecting", f"attempt {attempt}")
                self.status.set_turn(None)
                self.sidebar.clear_running()   # unknown until the reconnect lists the sessions again
            case Disconnected(code=code, error=error):
                self.status.set_connection("disconnected", code)
                self.status.set_turn(None)
                self.sidebar.clear_running()
                await self.chat.add_error(f"Disconnected: {error}")

    async def after_connect(self, session: SessionInfo | None, running: TurnState | None) -> None:
        """Show the session HELLO attached to; a user without sessions gets none (HELLO ``session:
        null``): the chat stays empty and the first message sent creates the session (``send``)."""
        if session is None:
            await self._show_no_session()
        else:
            async def fetch() -> tuple[SessionInfo, TurnState | None]:
                return session, running
            await self.load_session(fetch)
        # the sidebar and the model list come after the first paint of the chat
        self.app.call_after_refresh(lambda: self.spawn(self.load_lists(), "lists"))

    async def _show_no_session(self) -> None:
        """The connection has no session (a user without any, or whose last one was just deleted): an
        empty chat under the server's default model, "New chat"; the first message sent creates one."""
        self.state = ChatState()
        self.status.set_turn(None)
        await self.chat.reset(None)
        self._set_header(self.agent.model if self.agent is not None else "", "New chat")
        self._settle_unsure(None, [])

    async def load_lists(self) -> None:
        await self.load_sessions()
        try:
            self.models = list((await self.client.model_list()).models)
        except ClientError as exc:  # the palette then offers no model: say why in the log
            self.app.log.warning(f"model list unavailable: {exc}")
            self.models = []

    async def load_sessions(self) -> None:
        sessions: list[SessionInfo] = []
        before = None
        while len(sessions) < self.cfg.sidebar_max_sessions:
            page = await self.client.session_list(before=before, limit=min(100, self.cfg.sidebar_max_sessions))
            sessions.extend(page.sessions)
            before = page.next_before
            if not page.has_more or not before:
                break
        current = self.session
        if current is not None and all(s.session_id != current.session_id for s in sessions):
            sessions.append(current)
        self.sidebar.set_sessions(sessions)

    # -- sessions ---------------------------------------------------------------------------------------
    async def load_session(self, fetch: Fetch, *, focus: bool = False) -> None:
        """Fetch a session (switch/new/hello) and show its newest page; turn events wait meanwhile.

        ``focus``: the user asked for it (new, switch, delete, clear), so the input gets the focus."""
        self._loads += 1
        try:
            async with self._load_lock:
                session, running = await fetch()
                if session is None:   # none left (the user's last session was deleted): nothing to load
                    await self._show_no_session()
                    if focus:
                        self.focus_input()
                    return
                sid = session.session_id
                changes = self.state.begin(session)
                chat = self.chat
                await chat.reset(sid)
                self.sidebar.upsert(session)
                self.sidebar.set_current(sid)
                self._show_header(session)
                page = await self.client.history_page(sid, limit=self.page_size)
                await chat.show_page(self.state.reloaded(page))
                if running is not None:
                    changes += self.state.attach(running)
                await self.render(changes)
                if self._unsure:
                    self._settle_unsure(sid, list(page.messages) + (
                        [running.user_message, *(q.user_message for q in running.queued)] if running else []))
                if focus:
                    self.focus_input()
                chat.call_after_refresh(chat.check_top)
        finally:
            try:
                while self.deferred and self._loads == 1:
                    batch, self.deferred = self.deferred, []
                    for run in runs(batch):
                        await self.on_turn_run(run)
            finally:
                self._loads -= 1

    async def switch(self, session_id: str) -> None:
        if session_id == self.session_id:   # already open: only the focus moves back to the input
            self.focus_input()
            return

        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            reply = await self.client.session_switch(session_id)
            return reply.session, reply.running_turn
        await self.load_session(fetch, focus=True)

    async def new_session(self) -> None:
        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            return (await self.client.session_new()).session, None
        await self.load_session(fetch, focus=True)

    async def rename(self, title: str) -> None:
        reply = await self.client.session_rename(title, session_id=self.session_id)
        self._session_changed(reply.session)
        self.focus_input()

    async def delete(self, session_id: str) -> None:
        self._deleting.add(session_id)
        try:
            if session_id != self.session_id:
                await self.client.session_delete(session_id)
                self.sidebar.remove(session_id)
                self.focus_input()
                return

            async def fetch() -> tuple[SessionInfo | None, TurnState | None]:
                reply = await self.client.session_delete(session_id)
                self.sidebar.remove(session_id)
                # the connection moved to the newest remaining session; none (``current: null``) when
                # the server leaves a connection without a session once the user's last one is deleted
                return reply.current, None
            await self.load_session(fetch, focus=True)
        finally:
            self._deleting.discard(session_id)

    async def clear(self, purge: bool = False) -> None:
        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            return (await self.client.session_clear(self.session_id, purge=purge)).session, None
        await self.load_session(fetch, focus=True)

    # -- trash --------------------------------------------------------------------------------------------
    async def trash(self) -> list[SessionInfo]:
        """The user's deleted sessions (the first page of the trash, as long as the sidebar's limit)."""
        page = await self.client.session_list(limit=min(100, self.cfg.sidebar_max_sessions), deleted=True)
        return list(page.sessions)

    async def restore(self, session_id: str) -> None:
        reply = await self.client.session_restore(session_id)
        self.sidebar.upsert(reply.session)

    async def purge(self, session_id: str) -> None:
        await self.client.session_purge(session_id)
        self.sidebar.remove(session_id)

    # -- knowledge base (docs/protocol.md §5.8) ---------------------------------------------------------
    def kb_ops(self, folder: Path) -> KnowledgeOps:
        """The Knowledge panel's operations on this client; downloads go to ``folder``."""
        client = self.client

        async def listing() -> tuple[KbDocument, ...]:
            return await kbclient.list_documents(client)

        async def download(doc: KbDocument, dest: Path) -> KbDocument:
            await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
            return await kbclient.download(client, doc.doc_id, dest)

        async def delete(doc_id: str) -> KbDeleteReply:
            """The server's reply, handed to the panel: its ``kept_for`` says the document was not
            removed but stays with another group member who uploaded the same bytes."""
            reply = await client.request(MsgType.KB_DELETE, {"doc_id": doc_id})
            assert isinstance(reply, KbDeleteReply), f"KB_DELETE answered by {type(reply).__name__}"
            return reply
        return KnowledgeOps(listing, self.uploads.upload, download, delete, folder, self.uploads)

    async def passage(self, chunk_id: str) -> KbHit:
        """A cited passage; a document deleted since the answer cited it is NOT_FOUND, said as such."""
        try:
            return (await self.client.request(MsgType.KB_PASSAGE, {"chunk_id": chunk_id})).passage  # type: ignore
        except ClientError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                raise ClientError(exc.code, "the document of this citation was deleted (or you can no longer "
                                            "see it)") from exc
            raise

    # -- the session's own system prompt ----------------------------------------------------------------
    async def system_prompt(self) -> str:
        """The current session's own system prompt ("" when the server's default is used)."""
        return (await self.client.session_prompt(session_id=self.session_id)).system_prompt or ""

    async def set_system_prompt(self, text: str, session_id: str | None = None) -> None:
        """Set the system prompt of ``session_id``: the session whose prompt the editor was opened on
        (default: the current one), not whichever is current when it is saved."""
        reply = await self.client.session_prompt(text, session_id=session_id or self.session_id)
        self._session_changed(reply.session)
        self.app.notify("System prompt saved" if reply.system_prompt else "System prompt reset to the server's")
        self.focus_input()

    def _session_changed(self, session: SessionInfo) -> None:
        self.sidebar.upsert(session)
        if self.state.session_changed(session):
            self._show_header(session)

    def _show_header(self, session: SessionInfo) -> None:
        """The header: the app and the session's model as title, the session title as sub-title."""
        self._set_header(session.model, session.title)

    def _set_header(self, model: str | None, subtitle: str) -> None:
        base = type(self.app).TITLE
        self.app.title = f"{base} · {printable(model)}" if model else base
        self.app.sub_title = printable(subtitle)

    async def on_session_event(self, event: SessionEvent) -> None:
        sid = event.session.session_id
        if event.kind == "purged":   # gone for good; a live one was "deleted" first (that event moved us)
            self.sidebar.remove(sid)
            return
        if event.kind == "deleted":
            self.sidebar.remove(sid)
            if sid == self.session_id and sid not in self._deleting:
                self.app.notify("This session was deleted by another client", severity="warning")
                self.spawn(self._leave_deleted(self.sidebar.newest_other(sid)), "session")
            return
        self._session_changed(event.session)
        if event.kind in SESSION_KINDS_RELOAD and sid == self.session_id and not self._loads:
            self.spawn(self.reload(), "session")

    async def _leave_deleted(self, other: str | None) -> None:
        """The session on screen was deleted by another client: open ``other`` (the newest remaining
        one the sidebar knows). None left, or ``other`` gone too (deleted at the same time): show no
        session, as the server left the connection without one (deleting never creates a session;
        the next message sent goes to the session the server attached the connection to, or starts one)."""
        if other is not None:
            try:
                await self.switch(other)
                return
            except ClientError as exc:
                if exc.code is not ErrorCode.NOT_FOUND:
                    raise

        async def fetch() -> tuple[None, None]:
            return None, None
        await self.load_session(fetch)

    async def reload(self) -> None:
        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            reply = await self.client.session_switch(self.session_id or "")
            return reply.session, reply.running_turn
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

    async def jump_to(self, hit: SearchHit) -> None:
        """Open the hit's session and load older pages until its message is shown, then scroll to it."""
        await self.switch(hit.session_id)
        chat, mid = self.chat, hit.message_id
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
    @property
    def max_text_chars(self) -> int | None:
        """The server's limit on a message's length (HELLO ``limits.max_text_chars``), if it gave one."""
        limits = self.client.hello.limits if self.client.hello is not None else {}
        cap = limits.get("max_text_chars")
        return cap if isinstance(cap, int) and cap > 0 else None

    def unsendable(self, text: str) -> str | None:
        """Why ``text`` cannot be sent now (None: it can): no connection, or longer than the server takes."""
        if not self.client.connected:
            return f"The connection is {self.client.state}: your message stays in the input; send it again " \
                   "once connected."
        cap = self.max_text_chars
        if cap is not None and len(text) > cap:
            return f"The message has {len(text):,} characters; the server takes at most {cap:,}. " \
                   "Shorten it (it stays in the input)."
        return None

    async def send(self, text: str) -> None:
        self.chat.follow()    # what the user sends (or why it was not sent) and its answer show even when scrolled up
        async with self._first_send:
            if self.client.session_id is None:   # the user has no session yet: this message creates it
                await self._send_first(text)
                return
        sid = self.session_id
        reply = await self._chat_send(text)
        if reply.session_id != sid:   # the server put it elsewhere (the session shown, if any, is gone): show that one
            await self._open_sent(reply.session_id)
            return
        async with self._load_lock:   # a (re)load of the chat meanwhile shows its page first: the message goes below
            if self.session_id == sid:
                await self.render(self.state.sent(reply))

    async def _open_sent(self, session_id: str) -> None:
        """Show the session a message just sent went to, with its turn reattached from the switch reply
        (its events wait until the page is shown)."""
        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            reply = await self.client.session_switch(session_id)
            return reply.session, reply.running_turn
        await self.load_session(fetch, focus=True)    # adds it to the sidebar too

    async def _chat_send(self, text: str) -> ChatSendReply:
        """CHAT_TEXT. A message that surely did not reach the server (it could not go out, or the server
        refused it: an ERROR reply) comes back into the input. One whose fate is unknown (the link
        dropped before the reply came, or the reply timed out) does not, as sending it again could
        send it twice: it stays recallable with Up, and the next load of its session says whether
        the server has it (``_settle_unsure``)."""
        after = max(self.chat.by_id, default=0)
        try:
            if not self.client.connected:   # lost since the app checked
                raise ClientError(ClientCode.NOT_CONNECTED, f"not sent (connection {self.client.state})")
            return await self.client.chat_send(text)
        except ClientError as exc:
            if exc.code is not ClientCode.NOT_CONNECTED and not isinstance(exc.code, ErrorCode):
                self._unsure.append(Unsure(self.session_id, text, after))
                raise ClientError(exc.code, f"{exc.message}. The message may have reached the server, so it is not "
                                            "put back in the input (Up recalls it)") from exc
            self._give_back(text)
            raise

    def _give_back(self, text: str) -> None:
        """A message that surely did not reach the server comes back into the input (ChatInput.give_back)."""
        try:
            self.app.query_one(ChatInput).give_back(text)
        except NoMatches:  # the app is shutting down
            self.app.log.debug("no input to give the text back to")

    def _settle_unsure(self, session_id: str | None, shown: list[ChatMessage]) -> None:
        """Say whether the messages of ``session_id`` whose fate was unknown reached the server, now that
        its stored messages (``shown``: the newest page, the running and queued turns) are known."""
        left: list[Unsure] = []
        for item in self._unsure:
            if item.session_id is not None and item.session_id != session_id:
                left.append(item)   # told when its session is loaded
            elif any(m.role == "user" and m.content == item.text and (m.id is None or m.id > item.after)
                     for m in shown):
                self.app.notify(f"{quote(item.text)} reached the server: it is in the chat, do not send it again.",
                                title="Message sent", timeout=10)
            else:
                self.app.notify(f"{quote(item.text)} did not reach the server: Up in the input recalls it to send "
                                "it again.", title="Message not sent", severity="warning", timeout=10)
        self._unsure = left

    async def _send_first(self, text: str) -> None:
        """Send into no session (the server creates it with this message), then show the new session:
        its turn is reattached from the switch reply, and its events wait until the page is shown."""
        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            sent = await self._chat_send(text)
            reply = await self.client.session_switch(sent.session_id)
            return reply.session, reply.running_turn
        await self.load_session(fetch, focus=True)    # adds the new session to the sidebar too

    def redo_refused(self) -> str | None:
        """Why a regenerate or an edit-and-resend is not sent now (None: it may be): an answer is
        running in this session, which the server would refuse (QUEUE_FULL) anyway."""
        if self.state.live_turn is not None:
            return REDO_WHILE_LIVE
        return None

    async def regenerate(self) -> None:
        """Answer the last user message again; the chat reloads without the superseded answer."""
        await self._redo(lambda sid: self.client.chat_regenerate(session_id=sid))

    async def edit(self, message_id: int, text: str) -> None:
        """Resend user message ``message_id`` as ``text``; it and what followed are superseded. An edit
        that surely did not reach the server (not connected, or refused: an ERROR reply such as
        QUEUE_FULL while a turn runs) gives the edited text back into the input, as a refused send does."""
        await self._redo(lambda sid: self.client.chat_edit(message_id, text, session_id=sid), text)

    async def _redo(self, request: Callable[[str | None], Awaitable[Any]], text: str | None = None) -> None:
        """Send a regenerate/edit, then reload: superseded messages leave the default history page, and
        the new turn is reattached from the switch reply (its events wait until the page is shown).
        ``text``: the edited text, given back into the input when the request surely did not reach the
        server (not connected, or refused)."""
        if not self.client.connected:
            if text is not None:
                self._give_back(text)
            await self.chat.add_error(f"Not sent (connection {self.client.state})")
            return
        sid = self.session_id

        async def fetch() -> tuple[SessionInfo, TurnState | None]:
            try:
                await request(sid)
            except ClientError as exc:
                if text is not None and (exc.code is ClientCode.NOT_CONNECTED or isinstance(exc.code, ErrorCode)):
                    self._give_back(text)
                raise
            reply = await self.client.session_switch(sid or "")
            return reply.session, reply.running_turn
        await self.load_session(fetch, focus=True)

    async def cancel(self) -> None:
        turn_id = self.state.live_turn
        if turn_id is None:
            return
        try:
            await self.client.chat_cancel(session_id=self.session_id, turn_id=turn_id)
        except ClientError as exc:
            if exc.code is not ErrorCode.NO_ACTIVE_TURN:
                raise

"""The NPLT Textual app: layout, key bindings and actions. The logic lives in ``controller.Controller``."""
from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Iterable

from textual import events
from textual.markup import escape
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer, Header

from protocol.messages import MAX_PROMPT_CHARS
from protocol.objects import SearchHit

from client import files, paths
from client.config import ClientConfig
from client.connection import Backoff, Client
from client.errors import ClientCode, ClientError
from client.tui import commands
from client.tui.chat import ChatView, code_blocks
from client.tui.message import MessageView
from client.tui.citations import CitationList, PassageModal
from client.tui.clear import ClearChoice, ClearModal
from client.tui.controller import Controller
from client.tui.editor import TextEditModal
from client.tui.input import ChatInput
from client.tui.knowledge import KnowledgeScreen
from client.tui.memory_panel import MemoryPanel
from client.tui.modals import ConfirmModal, ExportModal, HelpScreen, RenameModal, SearchModal
from client.tui.why import WhyScreen, why_lines
from client.tui.sidebar import Sidebar
from client.tui.hangup import CHECK_S, TerminalWatch
from client.tui.saved import SavedState
from client.tui.status import StatusLine
from client.tui.trash import TrashScreen
from client.wording import printable


EXIT_HANGUP = 129   # 128 + SIGHUP, as a shell reports a process ended by it
SIDEBAR_MIN_WIDTH = 70   # columns: on a narrower terminal the sidebar hides (unless ctrl+b showed it)
# Breakpoint classes of every screen (app.tcss), so that dialogs fit: narrower buttons below 80
# columns; one-line buttons and a tighter padding below 60 columns (buttons in two columns) or 20
# rows (the notes that only repeat the keys hidden).
DIALOG_NARROW_WIDTH, DIALOG_FULL_WIDTH, DIALOG_SHORT_HEIGHT = 60, 80, 20


class NpltApp(App[None]):
    """Chat with the NPLT assistant: sessions sidebar, streamed answers, tool calls, search, export."""

    CSS_PATH = "app.tcss"
    TITLE = "NPLT Assistant"
    BINDINGS = commands.bindings()
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (DIALOG_NARROW_WIDTH, "-medium"), (DIALOG_FULL_WIDTH, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (DIALOG_SHORT_HEIGHT, "-tall")]

    def __init__(self, config: ClientConfig | None = None, *, show_times: bool = True,
                 show_address: bool = True, client: Client | None = None, state_path: Path | None = None) -> None:
        super().__init__()
        self.config = config or ClientConfig()
        self.state_path = state_path if state_path is not None else paths.state_file()
        self.terminal = TerminalWatch(self._terminal_gone)
        self._save_lock = asyncio.Lock()
        self._unsaved: list[str] = []   # inputs sent since the last save of the state file
        self.show_times, self.show_address = show_times, show_address
        self.sidebar_choice: bool | None = None   # shown/hidden by the user (ctrl+b); None: follows the width
        self.client = client or Client(
            self.config.host, self.config.port, token=self.config.token, tls=self.config.tls.context(),
            client_name="nplt-tui/0.1", reconnect=True,
            backoff=Backoff(initial=self.config.reconnect_initial_s, maximum=self.config.reconnect_max_s),
            request_timeout=self.config.request_timeout_s, connect_timeout=self.config.connect_timeout_s,
            event_queue_size=self.config.event_queue_size, liveness_timeout=self.config.liveness_timeout_s)
        self.controller = Controller(self, self.client, self.config)

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar", show_times=self.show_times)
            with Vertical(id="chat-pane"):
                yield ChatView(id="chat", show_times=self.show_times)
                yield StatusLine(id="status",
                                 address=f"{self.config.host}:{self.config.port}" if self.show_address else "")
                yield ChatInput(id="input")
        yield Footer()

    def on_mount(self) -> None:
        if self.config.theme in self.available_themes:
            self.theme = self.config.theme
        else:
            self.notify(f"Unknown theme {self.config.theme!r}", severity="warning")
        if self.config.keymap:
            self.set_keymap(self.config.keymap)
            bad = commands.unknown_ids(self.config.keymap)
            if bad:
                self.notify(f"Unknown binding ids in keymap: {', '.join(bad)}", severity="warning")
        self.query_one(ChatInput).focus()
        self.run_worker(self.controller.run(), name="client", group="client", exit_on_error=False)
        self.run_worker(self._restore_state(), name="restore", group="state", exit_on_error=False)
        self.terminal.install_signal()
        self.set_interval(CHECK_S, self.terminal.check)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification (widgets' and screens' ``notify`` come here), made printable: they quote
        the server (errors, notices, names), whose control characters must not reach the terminal, and
        shown as plain text: a "[@click=app.quit]" in a document name or an error is not markup."""
        super().notify(printable(message), title=printable(title), severity=severity, timeout=timeout,
                       markup=markup)

    def _terminal_gone(self, reason: str) -> None:
        """SIGHUP or a hung-up terminal: nobody can see or type here any more; exit (code 129)."""
        self.exit(return_code=EXIT_HANGUP)

    # -- saved state (theme picked in the palette, input history) -----------------------------------------
    async def _restore_state(self) -> None:
        saved = await asyncio.to_thread(SavedState.load, self.state_path)
        # an explicit theme (config file, environment, flag) wins over the one last picked in the palette
        if saved.theme in self.available_themes and self.config.theme == ClientConfig().theme:
            self.theme = saved.theme
        box = self.query_one(ChatInput)
        box.recall[:0] = saved.history
        self.theme_changed_signal.subscribe(self, lambda _theme: self._save_state_soon(theme=True))

    def _save_state_soon(self, *, theme: bool = False) -> None:
        self.run_worker(self._save_state(theme), group="state", exit_on_error=False)

    async def _save_state(self, theme: bool) -> None:
        """Merge what this TUI changed (the theme picked, the inputs sent) into the state file, which
        another TUI may be saving to as well (``SavedState.update``)."""
        async with self._save_lock:   # one writer at a time in this process
            added, self._unsaved = self._unsaved, []
            try:
                await asyncio.to_thread(SavedState.update, self.state_path, theme=self.theme if theme else None,
                                        added=added)
            except OSError as exc:   # a read-only home: the TUI works, it just does not remember
                self._unsaved[:0] = added
                self.log.warning(f"cannot save the TUI state to {self.state_path}: {exc}")

    async def on_unmount(self) -> None:
        self.terminal.remove_signal()
        await self.client.close()

    # -- messages from widgets --------------------------------------------------------------------------
    def on_chat_input_submitted(self, event: ChatInput.Submitted) -> None:
        problem = self.controller.unsendable(event.text)
        if problem is not None:   # the text stays in the input
            self.query_one(ChatInput).keep(event.text)
            self.notify(problem, title="Not sent", severity="warning", timeout=6)
            return
        self._remember_sent(event.text)
        self.controller.spawn(self.controller.send(event.text), "send")

    def _remember_sent(self, text: str) -> None:
        """``text`` goes to the server (a message, or an edited one): Up/Down recall it (ChatInput.accept),
        and the input history, which survives a restart, keeps it."""
        self.query_one(ChatInput).accept(text)
        self._unsaved.append(text)
        self._save_state_soon()

    def on_sidebar_selected(self, event: Sidebar.Selected) -> None:
        self.controller.spawn(self.controller.switch(event.session_id), "session")

    def on_chat_view_need_older(self, event: ChatView.NeedOlder) -> None:
        self.controller.spawn(self.controller.load_older(), "older")

    # -- actions ----------------------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(commands.help_rows(self.config.keymap)))

    def action_cancel_turn(self) -> None:
        self.controller.spawn(self.controller.cancel(), "cancel")

    def action_focus_input(self) -> None:
        self.query_one(ChatInput).focus()

    def action_focus_sessions(self) -> None:
        sidebar = self.query_one(Sidebar)
        if not sidebar.display:   # hidden on a narrow terminal: the user asks for it
            self.action_toggle_sidebar()
        sidebar.list.focus()

    def action_toggle_sidebar(self) -> None:
        self.sidebar_choice = not self.query_one(Sidebar).display
        self._show_sidebar(self.sidebar_choice)

    def on_resize(self, event: events.Resize) -> None:
        self.fit_sidebar(event.size.width)

    def fit_sidebar(self, width: int) -> None:
        """Hide the sidebar below ``SIDEBAR_MIN_WIDTH`` columns, so the chat keeps a usable width, and
        show it again when wider; once the user showed or hid it (ctrl+b), it stays as they chose."""
        if self.sidebar_choice is None:
            self._show_sidebar(width >= SIDEBAR_MIN_WIDTH)

    def _show_sidebar(self, shown: bool) -> None:
        """Show or hide the sidebar; hidden while it has the focus, the focus goes to the message input
        (else nothing would have it, and what is typed would be lost)."""
        sidebar = self.query_one(Sidebar)
        focused = sidebar.screen.focused
        had_focus = focused is not None and sidebar in focused.ancestors_with_self
        sidebar.display = shown
        if had_focus and not shown:
            self.query_one(ChatInput).focus()

    def action_load_older(self) -> None:
        chat = self.query_one(ChatView)
        if chat.has_more and not chat.loading_older:
            chat.loading_older = True
            self.controller.spawn(self.controller.load_older(), "older")

    def action_new_session(self) -> None:
        self.controller.spawn(self.controller.new_session(), "session")

    def action_rename_session(self) -> None:
        session = self.controller.session
        if session is None:   # no session yet (the first message creates it)
            return

        def done(title: str | None) -> None:
            if title:
                self.controller.spawn(self.controller.rename(title), "rename")
        self.push_screen(RenameModal(session.title), done)

    def action_delete_session(self) -> None:
        sid = self.controller.session_id
        if not sid:
            return
        session = self.controller.session
        title = (session.title if session is not None else "") or sid

        def done(ok: bool | None) -> None:
            if ok:
                self.controller.spawn(self.controller.delete(sid), "session")
        self.push_screen(ConfirmModal(f"Delete session “{title}”? It moves to the trash (F10): you can restore it "
                                      "there until you purge it, which removes it for good.", "Delete"), done)

    def action_clear_session(self) -> None:
        if not self.controller.session_id:
            return
        session = self.controller.session
        title = (session.title if session is not None else "") or self.controller.session_id or ""

        def done(choice: ClearChoice | None) -> None:
            if choice:
                self.controller.spawn(self.controller.clear(purge=choice == "purge"), "session")
        self.push_screen(ClearModal(title), done)

    def action_trash(self) -> None:
        if not any(isinstance(s, TrashScreen) for s in self.screen_stack):
            c = self.controller
            self.push_screen(TrashScreen(c.trash, c.restore, c.purge))

    def action_system_prompt(self) -> None:
        if not self.controller.session_id or any(isinstance(s, TextEditModal) for s in self.screen_stack):
            return

        sid = self.controller.session_id                 # (saved to this session, whatever is current then)

        async def open_editor() -> None:
            current = await self.controller.system_prompt()
            self._prompt_editor(current, current, sid)
        self.controller.spawn(open_editor(), "prompt")

    def _prompt_editor(self, current: str, text: str, sid: str | None = None) -> None:
        """The system prompt editor holding ``text`` (``current``: the session's prompt now). A
        prompt over ``MAX_PROMPT_CHARS`` is refused in the editor; one the server refuses (a store's
        lower limit, a lost connection) is notified and the editor opens again with it: never lost."""
        def done(new: str | None) -> None:
            if new is not None and new != current:
                self.controller.spawn(self._save_prompt(current, new, sid), "prompt")
        self.push_screen(TextEditModal(
            "System prompt of this session", text, allow_empty=True, max_chars=MAX_PROMPT_CHARS,
            note="Used instead of the server's system prompt for every later answer of this session. "
                 "Leave it empty to use the server's default. Ctrl+S saves, Esc cancels."), done)

    async def _save_prompt(self, current: str, text: str, sid: str | None = None) -> None:
        try:
            await self.controller.set_system_prompt(text, sid)
        except ClientError as exc:
            self.notify(f"System prompt not saved: {printable(exc.message)}", title=str(exc.code),
                        severity="error", timeout=10)
            if not any(isinstance(s, TextEditModal) for s in self.screen_stack):
                self._prompt_editor(current, text, sid)

    def action_knowledge(self, upload_first: bool = False) -> None:
        if not any(isinstance(s, KnowledgeScreen) for s in self.screen_stack):
            self.push_screen(KnowledgeScreen(self.controller.kb_ops(paths.export_dir()), upload_first=upload_first))

    def action_upload(self) -> None:
        screen = next((s for s in self.screen_stack if isinstance(s, KnowledgeScreen)), None)
        if screen is None:
            self.action_knowledge(upload_first=True)
        else:
            screen.query_one("#kb-path").focus()

    def on_citation_list_open(self, event: CitationList.Open) -> None:
        async def show() -> None:
            self.push_screen(PassageModal(await self.controller.passage(event.chunk_id)))
        self.controller.spawn(show(), "passage")

    def action_regenerate(self) -> None:
        if self.controller.session_id and not self._redo_refused():
            self.controller.spawn(self.controller.regenerate(), "redo")

    def _redo_refused(self, text: str | None = None) -> bool:
        """A regenerate or edit while an answer of this session runs is refused here, with a
        notification (the server would answer QUEUE_FULL); ``text``, an edited message, goes back
        into the input, as a refused edit does."""
        problem = self.controller.redo_refused()
        if problem is None:
            return False
        if text is not None:
            self.query_one(ChatInput).give_back(text)
        self.notify(problem, title="Not sent", severity="warning", timeout=6)
        return True

    def action_edit_message(self) -> None:
        if self._redo_refused():
            return
        view = self._user_message_to_edit()
        if view is None or view.message_id is None:
            self.notify("No sent message to edit", severity="warning")
            return
        mid = view.message_id

        def done(text: str | None) -> None:
            if text:
                self._remember_sent(text)   # recalled with Up, and given back into the input if refused
                if not self._redo_refused(text):   # an answer started while the dialog was open
                    self.controller.spawn(self.controller.edit(mid, text), "redo")
        self.push_screen(TextEditModal(
            "Edit and resend", view.content, ok_label="Send", max_chars=self.controller.max_text_chars,
            note="The message is sent again with this text; it and everything after it are superseded "
                 "(kept on the server, hidden from the chat and the model). Ctrl+S sends, Esc cancels."), done)

    def action_search(self) -> None:
        async def search(query: str) -> tuple[SearchHit, ...]:
            return (await self.client.search(query)).hits

        def done(hit: SearchHit | None) -> None:
            if hit:
                self.controller.spawn(self.controller.jump_to(hit), "session")
        self.push_screen(SearchModal(search), done)

    def action_export(self) -> None:
        sid = self.controller.session_id
        if not sid or any(isinstance(s, ExportModal) for s in self.screen_stack):
            return   # one export dialog at a time

        def done(choice: tuple[str, str] | None) -> None:
            if choice:
                self.controller.spawn(self.export_unless_kept(sid, *choice), "export")
        self.push_screen(ExportModal(f"nplt-{sid}", paths.export_dir()), done)

    async def export_unless_kept(self, session_id: str, fmt: str, path: str) -> None:
        """Export, after asking before an existing file is replaced (No keeps it and exports nothing).
        ``path`` follows the rules of ``kb download -o`` (``client.files.export_target``): a folder
        means ``nplt-<session>.<ext>`` in it (no question unless that file exists), a path ending in
        a separator that is no folder is refused; a FIFO or a device is written through, unasked."""
        try:
            target = await asyncio.to_thread(files.export_target, path, files.export_name(session_id, fmt))
        except OSError as exc:
            raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {path}: {exc.strerror or exc}") from exc
        if not await asyncio.to_thread(files.replaces_a_file, target):
            await self.export(session_id, fmt, target)
            return

        def done(ok: bool | None) -> None:
            if ok:
                self.controller.spawn(self.export(session_id, fmt, target), "export")
        self.push_screen(ConfirmModal(f"{target} already exists.\n\nReplace it with this export?", "Replace"), done)

    async def export(self, session_id: str, fmt: str, target: Path) -> None:
        """Write the export to ``target`` (``client.files.write_export``: atomically, so a failed write
        leaves an existing file as it was); a missing folder above it is created (the default export
        folder may not exist yet)."""
        reply = await self.client.export(fmt, session_id=session_id)
        try:
            await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            await files.write_export(target, reply.content.encode("utf-8"))
        except OSError as exc:
            raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {target}: {exc.strerror or exc}") from exc
        self.notify(f"Exported to {target}")

    def _message_for_copy(self, need_code: bool = False) -> MessageView | None:
        node = self.focused
        while node is not None and not isinstance(node, MessageView):
            node = node.parent
        if isinstance(node, MessageView):
            return node
        for view in reversed(self.query_one(ChatView).messages()):
            if view.role == "assistant" and (not need_code or code_blocks(view.content)):
                return view
        return None

    def _user_message_to_edit(self) -> MessageView | None:
        """The focused message when it is a stored user message, else the last stored user message."""
        node = self.focused
        while node is not None and not isinstance(node, MessageView):
            node = node.parent
        if isinstance(node, MessageView) and node.role == "user" and node.message_id is not None:
            return node
        for view in reversed(self.query_one(ChatView).messages()):
            if view.role == "user" and view.message_id is not None:
                return view
        return None

    def action_copy_message(self) -> None:
        view = self._message_for_copy()
        if view is None:
            self.notify("Nothing to copy", severity="warning")
            return
        self.copy_to_clipboard(view.content)
        self.notify("Message copied")

    def action_copy_code(self) -> None:
        view = self._message_for_copy(need_code=True)
        blocks = code_blocks(view.content) if view else []
        if not blocks:
            self.notify("No code block to copy", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied")

    def action_memory(self) -> None:
        if not any(isinstance(s, MemoryPanel) for s in self.screen_stack):
            self.push_screen(MemoryPanel(self.client.memory_list, self.client.memory_forget, self._session_title))

    def _session_title(self, session_id: str) -> str | None:
        """The title of a session the sidebar lists (None: not listed, deleted say)."""
        info = self.query_one(Sidebar).sessions.get(session_id)
        return None if info is None else info.title

    def action_why(self) -> None:
        view = self._message_for_copy()
        if view is None or view.role != "assistant":
            self.notify("No answer to explain", severity="warning")
            return
        metadata = dict(view.message.metadata or {})

        async def show() -> None:
            texts: dict[str, str] = {}
            if (metadata.get("context") or {}).get("memory_items"):
                try:
                    texts = {i.id: i.text for i in (await self.client.memory_list()).items}
                except ClientError as exc:  # the view works without the texts (it shows the item ids)
                    self.log.warning(f"why: the memory items' texts could not be loaded: {exc}")
                    texts = {}
            self.push_screen(WhyScreen(f"Why this answer (#{view.message_id})", why_lines(metadata, texts)))
        self.controller.spawn(show(), "why")

    # -- command palette --------------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for spec in commands.palette_entries():
            if spec.action != "quit":
                yield SystemCommand(spec.title, spec.help, partial(self.run_action, spec.action))
        for model in self.controller.models:
            name = model.name
            yield SystemCommand(escape(f"Model: {printable(name)}"), "Use this model for the current session",
                                partial(self._switch_model, name))

    def _switch_model(self, name: str) -> None:
        async def switch() -> None:
            if self.client.session_id is None:   # no session yet: the model is the new session's
                await self.controller.new_session()
            reply = await self.client.model_switch(name)
            self.notify(f"Model: {reply.model}")
        self.controller.spawn(switch(), "model")

"""Review s31 of the client: two knowledge-base downloads at once on one client (the library routes
each data frame to its own download; the Knowledge panel runs one at a time, the next one waits),
the TUI refusing to start without a terminal, an edit-and-resend refused by the server coming back
into the input, `kb download -o DIR`, and deleting the last session. Round 2: sessions deleted by
another client (back to back, or the last one), the Knowledge panel closed while downloads run, and
`kb download -o NEWDIR/`."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import pytest
from textual.app import App
from textual.widgets import DataTable, TextArea

from client import kb as kbclient
from client import main as client_main
from client.connection import Client
from client.errors import ClientCode, ClientError
from client.main import main
from client.tui.app import NpltApp
from client.tui.editor import TextEditModal
from client.tui.input import ChatInput
from client.tui.knowledge import DOWNLOAD_STOPPED, KnowledgeScreen
from client.tui.modals import ConfirmModal
from client.tui.sidebar import Sidebar
from client_testlib import (SIZE, ServerThread, chat, open_app, push_download_panel, shown, type_and_send, v3_server,
                            wait_until)
from fake_client import FakeClient, stamp
from protocol import ErrorCode, MsgType
from protocol.kb import KbDocument
from protocol.objects import SessionInfo
from protocol.replies import ChatSendReply, SessionDeleteReply
from protocol.server_events import SessionEvent
from tui_script import answer, contents, notes, scripted_app, user

ROOT = Path(__file__).resolve().parents[2]
DOWNLOAD_WAITING = "waits for the download before it"     # client.tui.knowledge.DOWNLOAD_WAITING


def _document(tag: str, lines: int = 20_000) -> bytes:
    """A text document of about 1.3 MB (many data frames), different for each tag."""
    return "".join(f"{tag} {i:06d}: the backup of shard {i % 97} finished without errors\n"
                   for i in range(lines)).encode()


def _requests(c: Client) -> list[tuple[MsgType, dict[str, Any]]]:
    """Record every request ``c`` makes (type and body)."""
    seen: list[tuple[MsgType, dict[str, Any]]] = []
    request = c.request

    async def recording(msg_type, body=None, timeout=None):
        seen.append((msg_type, dict(body or {})))
        return await request(msg_type, body, timeout)
    c.request = recording  # type: ignore[method-assign]
    return seen


# -- 1. two downloads at once -----------------------------------------------------------------------------
async def test_two_downloads_at_once_on_one_client_each_get_their_own_bytes(tmp_path: Path) -> None:
    """The second download no longer takes the first one's data frames (which made the first fail
    its md5 check and lose its part file): each frame goes to the download its handle names."""
    a, b = _document("alpha"), _document("bravo")
    (tmp_path / "alpha.log").write_bytes(a)
    (tmp_path / "bravo.log").write_bytes(b)
    out = tmp_path / "out"
    out.mkdir()
    async with v3_server(tmp_path / "srv") as (_, (host, port)):
        async with Client(host, port) as c:
            doc_a = await kbclient.upload(c, tmp_path / "alpha.log")
            doc_b = await kbclient.upload(c, tmp_path / "bravo.log")
            got = await asyncio.gather(kbclient.download(c, doc_a.doc_id, out / "a.log"),
                                       kbclient.download(c, doc_b.doc_id, out / "b.log"), return_exceptions=True)
            assert [getattr(d, "doc_id", d) for d in got] == [doc_a.doc_id, doc_b.doc_id]
            assert MsgType.KB_DOWNLOAD_DATA not in c.taps      # nothing left listening once both are done
    assert (out / "a.log").read_bytes() == a and (out / "b.log").read_bytes() == b
    assert sorted(p.name for p in out.iterdir()) == ["a.log", "b.log"]     # no part, no sidecar


def _doc(doc_id: str, name: str) -> KbDocument:
    return KbDocument(doc_id, name, "m" * 32, "s" * 64, 1000, 1, "user:me", stamp(1), "me")


async def test_the_panel_runs_one_download_at_a_time_and_says_the_next_one_waits(tmp_path: Path) -> None:
    docs = [_doc("d1", "first.md"), _doc("d2", "second.md")]
    running: list[str] = []
    most = [0]
    gates = {d.doc_id: asyncio.Event() for d in docs}
    started = {d.doc_id: asyncio.Event() for d in docs}

    async def listing() -> list[KbDocument]:
        return list(docs)

    async def download(doc: KbDocument, dest: Path) -> KbDocument:
        running.append(doc.doc_id)
        most[0] = max(most[0], len(running))
        started[doc.doc_id].set()
        await gates[doc.doc_id].wait()
        dest.write_text(doc.name)
        running.remove(doc.doc_id)
        return doc

    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        panel = await push_download_panel(app, pilot, tmp_path, listing, download)
        await pilot.press("d")
        await wait_until(started["d1"].is_set, pilot=pilot, what="the first download")
        await pilot.press("down", "d")      # the second document, while the first downloads
        await wait_until(lambda: any(DOWNLOAD_WAITING in n for n in notes(app)), pilot=pilot,
                         what="the note that the second one waits")
        assert f"second.md {DOWNLOAD_WAITING}" in notes(app) and not started["d2"].is_set()
        gates["d1"].set()
        await wait_until(started["d2"].is_set, pilot=pilot, what="the second download, after the first")
        gates["d2"].set()
        await wait_until(lambda: not panel.downloading, pilot=pilot, what="both downloads done")
        assert most[0] == 1
        assert {f"Downloaded to {tmp_path / 'first.md'}", f"Downloaded to {tmp_path / 'second.md'}"} <= set(notes(app))
        assert (tmp_path / "first.md").read_text() == "first.md" and (tmp_path / "second.md").read_text() == "second.md"


@asynccontextmanager
async def slow_link(addr: tuple[str, int], rate: float) -> AsyncIterator[tuple[str, int]]:
    """A TCP proxy to ``addr`` whose server-to-client direction carries ``rate`` bytes/s (a remote
    server over a slow link); yields its address."""
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: float | None) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
                if limit:
                    await asyncio.sleep(len(data) / limit)   # the link's bandwidth (not a synchronisation)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*addr)
        await asyncio.gather(pipe(reader, up_writer, None), pipe(up_reader, writer, rate))
    proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield proxy.sockets[0].getsockname()[:2]
    finally:
        proxy.close()


async def test_two_downloads_from_the_panel_over_a_slow_link(tmp_path: Path) -> None:
    """The reviewer's case end to end: d on one document, then d on the next while it downloads."""
    from client import paths
    data = {"alpha.log": _document("alpha"), "bravo.log": _document("bravo")}
    for name, content in data.items():
        (tmp_path / name).write_bytes(content)
    async with v3_server(tmp_path / "srv") as (_, addr), slow_link(addr, 3_000_000) as slow:
        async with Client(*addr) as c:
            for name in data:
                await kbclient.upload(c, tmp_path / name)
        async with open_app(slow, with_session=False) as (app, pilot):
            await pilot.press("f12")
            await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded, pilot=pilot,
                             what="the knowledge panel")
            panel = app.screen
            panel.query_one("#kb-table", DataTable).focus()
            await pilot.press("d", "down", "d")
            await wait_until(lambda: sum(n.startswith("Downloaded to") for n in notes(app)) == 2
                             or any("failed" in n for n in notes(app)), pilot=pilot, what="both downloads done")
            assert not [n for n in notes(app) if "failed" in n]
        folder = paths.export_dir()
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == data    # whole, and no part left


# -- 2. the TUI needs a terminal ----------------------------------------------------------------------------
@pytest.mark.parametrize("stdin", [subprocess.DEVNULL, subprocess.PIPE])
def test_the_tui_without_a_terminal_refuses_at_once(stdin: int) -> None:
    """`nplt-client --port P </dev/null >file` (a cron job that forgot the subcommand) used to draw the
    TUI into the file forever at high CPU; it now says why on stderr and exits 2, drawing nothing."""
    options: dict[str, Any] = {"input": b""} if stdin == subprocess.PIPE else {"stdin": stdin}
    proc = subprocess.run([sys.executable, "-m", "client.main", "--port", "9"], capture_output=True, timeout=60,
                          cwd=ROOT, **options)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.decode() == f"nplt-client: {client_main.NO_TERMINAL}\n"
    assert "needs a terminal" in client_main.NO_TERMINAL and "nplt-client --help" in client_main.NO_TERMINAL


def test_the_tui_with_only_stdin_a_terminal_refuses_too(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    """stdout redirected to a file, stdin on the terminal: still no screen to draw on."""
    ran: list[NpltApp] = []
    monkeypatch.setattr(NpltApp, "run", lambda app, *a, **k: ran.append(app))   # (never drawn here)
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(isatty=lambda: True))
    monkeypatch.setattr(sys, "stdout", SimpleNamespace(isatty=lambda: False, write=lambda s: len(s)))
    assert main(["--port", "9"]) == 2 and not ran
    assert capsys.readouterr().err == f"nplt-client: {client_main.NO_TERMINAL}\n"


# -- 3. a refused edit-and-resend gives the text back ---------------------------------------------------------
class _BusyClient(FakeClient):
    """A session with a turn running: the server refuses an edit with QUEUE_FULL."""

    async def chat_edit(self, message_id: int, text: str, session_id: str | None = None) -> Any:
        self.calls.append(("chat_edit", (message_id, text)))
        raise ClientError(ErrorCode.QUEUE_FULL, "session s1 has a turn running: wait for it or cancel it")


async def _edit(app: NpltApp, pilot: Any, text: str) -> None:
    await pilot.press("f5")
    await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the edit dialog")
    app.screen.query_one("#editor-text", TextArea).load_text(text)
    await pilot.press("ctrl+s")


async def test_an_edit_the_server_refuses_comes_back_into_the_input_and_recall() -> None:
    fake = _BusyClient(messages={"s1": [user(1, "first"), answer(2, "one")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 2, pilot=pilot)
        box = app.query_one(ChatInput)
        await _edit(app, pilot, "first, edited")
        await wait_until(lambda: box.text == "first, edited", pilot=pilot, what="the edited text given back")
        assert ("chat_edit", (1, "first, edited")) in fake.calls
        assert box.recall[-1] == "first, edited"           # Up recalls it too
        assert any("QUEUE_FULL" in str(e.render()) for e in chat(app).query(".error"))
        # not sent because the connection is down: given back as well (something typed meanwhile stays)
        box.load_text("")
        fake.state = "reconnecting"
        await _edit(app, pilot, "first, edited again")
        await wait_until(lambda: box.text == "first, edited again", pilot=pilot, what="the text given back")
        assert not any(c == ("chat_edit", (1, "first, edited again")) for c in fake.calls)
        fake.state = "connected"
        box.load_text("a draft")
        await _edit(app, pilot, "third edit")
        await wait_until(lambda: box.recall[-1] == "third edit" and ("chat_edit", (1, "third edit")) in fake.calls,
                         pilot=pilot, what="the third edit refused")
        await wait_until(lambda: sum("QUEUE_FULL" in str(e.render()) for e in chat(app).query(".error")) == 2,
                         pilot=pilot, what="its error")
        assert box.text == "a draft"


# -- 4. kb download -o DIR ------------------------------------------------------------------------------------
async def test_a_download_into_a_folder_goes_to_the_documents_name_in_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    content = _document("runbook", 2000)
    (tmp_path / "runbook.md").write_bytes(content)
    folder = tmp_path / "dl"
    folder.mkdir()
    async with v3_server(tmp_path / "srv") as (_, (host, port)):
        async with Client(host, port) as c:
            doc = await kbclient.upload(c, tmp_path / "runbook.md")
            await kbclient.download(c, doc.doc_id, folder)               # like cp: DIR/<name>
            assert (folder / "runbook.md").read_bytes() == content
            assert [p.name for p in folder.iterdir()] == ["runbook.md"]
            assert sorted(p.name for p in tmp_path.iterdir()) == ["dl", "runbook.md", "srv"]   # no DIR.part
            # a folder where the file would go: refused before a byte is fetched, nothing left
            (folder / "runbook.md").unlink()
            (folder / "runbook.md").mkdir()
            seen = _requests(c)
            with pytest.raises(ClientError) as info:
                await kbclient.download(c, doc.doc_id, folder)
            assert info.value.code is ClientCode.WRITE_FAILED
            assert MsgType.KB_DOWNLOAD not in [t for t, _ in seen]
            assert [p.name for p in folder.iterdir()] == ["runbook.md"] and not any((folder / "runbook.md").iterdir())
            (folder / "runbook.md").rmdir()
            # a local write failure after the bytes came (here the final rename): no part file is left
            def full(*_args: Any) -> None:
                raise OSError(28, "No space left on device")
            monkeypatch.setattr(kbclient, "os", SimpleNamespace(replace=full))
            with pytest.raises(OSError):
                await kbclient.download(c, doc.doc_id, folder / "copy.md")
            assert list(folder.iterdir()) == []
        monkeypatch.undo()
        # the CLI: -o DIR, unchanged
        code = await asyncio.to_thread(main, ["--host", host, "--port", str(port), "kb", "download", "runbook.md",
                                              "-o", str(folder)])
        assert code == 0
        assert (folder / "runbook.md").read_bytes() == content and [p.name for p in folder.iterdir()] == ["runbook.md"]


# -- 5. deleting the last session ---------------------------------------------------------------------------------
class _NoSessionLeft(FakeClient):
    """A server that leaves the connection without a session when the user's last one is deleted
    (``current: null``) instead of creating one."""

    async def session_delete(self, session_id: str) -> SessionDeleteReply:
        self.calls.append(("session_delete", session_id))
        self.trash[session_id] = self.sessions.pop(self._session(session_id).session_id)
        if self.sessions:
            self.session_id = next(iter(self.sessions))
            return SessionDeleteReply(session_id, self.sessions[self.session_id])
        self.session_id = None
        return SessionDeleteReply(session_id, None)


async def test_the_tui_deleting_the_last_session_shows_an_empty_chat_when_none_is_left() -> None:
    fake = _NoSessionLeft([SessionInfo("s1", "Only", stamp(0), stamp(5))], {"s1": [user(1, "hi"), answer(2, "yo")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 2, pilot=pilot)
        await app.run_action("delete_session")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete question")
        await pilot.press("y")
        await wait_until(lambda: app.controller.session_id is None and not contents(app), pilot=pilot,
                         what="the empty chat")
        assert chat(app).session_id is None and app.sub_title == "New chat"
        assert not any(c[0] == "session_new" for c in fake.calls)
        assert app.query_one(ChatInput).has_focus


def test_a_delete_reply_without_a_session_leaves_the_library_without_one() -> None:
    c = Client("127.0.0.1", 9, session_id="s_gone")
    c.link.track_session(None)
    assert c.session_id is None      # the next chat_send creates a session instead of using the deleted one


def test_the_cli_deleting_or_purging_the_last_session_never_creates_one(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path) as st:
        def run(*args: str) -> int:
            return main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
        for command in ("delete", "purge"):
            assert run("ask", "--new", "hello") == 0
            capsys.readouterr()
            assert run("sessions", "--json") == 0
            sessions = json.loads(capsys.readouterr().out)["sessions"]
            assert len(sessions) == 1
            assert run(command, sessions[0]["session_id"]) == 0
            capsys.readouterr()
            assert run("sessions", "--json") == 0
            assert json.loads(capsys.readouterr().out) == {"sessions": []}, command


# -- round 2 --------------------------------------------------------------------------------------------------
class _DeletedElsewhere(FakeClient):
    """A server on which another client deletes sessions: the library's session id stays the deleted one
    (nothing it sent moved it), and a message sent without a live session starts one, as the server does."""

    def delete_elsewhere(self, *session_ids: str) -> list[SessionEvent]:
        events = []
        for sid in session_ids:
            self.trash[sid] = self.sessions.pop(sid)
            events.append(SessionEvent("deleted", self.trash[sid]))
        return events

    async def chat_send(self, text: str, session_id: str | None = None) -> ChatSendReply:
        if self.session_id not in self.sessions:     # the connection has no session: this message starts one
            self.session_id = "s9"
            self.sessions["s9"], self.messages["s9"] = SessionInfo("s9", "New chat", stamp(40), stamp(40)), []
        reply = await super().chat_send(text, session_id)
        self.messages[reply.session_id] += [reply.user_message, answer(reply.user_message.id + 1, f"re: {text}")]
        return reply


def _no_session_shown(app: NpltApp) -> bool:
    return app.controller.session_id is None and chat(app).session_id is None and not contents(app) \
        and app.sub_title == "New chat" and app.controller._loads == 0


async def test_two_sessions_deleted_elsewhere_back_to_back_then_a_message_shows_its_new_session() -> None:
    """'deleted A' switched to B, already gone too: the TUI kept showing A, and the next message (which
    started a new session on the server) and its answer never appeared."""
    sessions = [SessionInfo("s1", "A", stamp(0), stamp(30)), SessionInfo("s2", "B", stamp(0), stamp(20))]
    fake = _DeletedElsewhere(sessions, {"s1": [user(1, "in A"), answer(2, "A's answer")], "s2": [user(3, "in B")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 2, pilot=pilot)
        await fake.push(*fake.delete_elsewhere("s1", "s2"))
        await wait_until(lambda: _no_session_shown(app), pilot=pilot, what="no session shown")
        assert ("session_switch", "s2") in fake.calls        # B was tried, and found gone
        assert not any(c[0] == "session_new" for c in fake.calls)
        assert app.query_one(Sidebar).sessions == {}
        await type_and_send(pilot, "typed after both deleted")
        await wait_until(lambda: contents(app) == [("user", "typed after both deleted"),
                                                   ("assistant", "re: typed after both deleted")],
                         pilot=pilot, what="the message and its answer in the new session")
        assert chat(app).session_id == app.controller.session_id == "s9" and app.sub_title == "New chat"
        assert ("session_switch", "s9") in fake.calls and "s9" in app.query_one(Sidebar).sessions


async def test_the_last_session_deleted_elsewhere_shows_no_session_and_creates_none() -> None:
    fake = _DeletedElsewhere([SessionInfo("s1", "Only", stamp(0), stamp(5))], {"s1": [user(1, "hi"), answer(2, "yo")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 2, pilot=pilot)
        await fake.push(*fake.delete_elsewhere("s1"))
        await wait_until(lambda: _no_session_shown(app), pilot=pilot, what="no session shown")
        assert "This session was deleted by another client" in notes(app)
        assert not any(c[0] == "session_new" for c in fake.calls) and fake.sessions == {}
        assert app.query_one(Sidebar).sessions == {}


async def test_closing_the_knowledge_panel_tells_which_downloads_stopped(tmp_path: Path) -> None:
    """Esc cancels the panel's downloads (the running one and the one waiting for it): each is notified,
    with how to resume it."""
    docs = [_doc("d1", "first.md"), _doc("d2", "second.md")]
    started, stopped = asyncio.Event(), []

    async def listing() -> list[KbDocument]:
        return list(docs)

    async def download(doc: KbDocument, dest: Path) -> KbDocument:
        started.set()
        try:
            await asyncio.Event().wait()     # a long download
        except asyncio.CancelledError:
            stopped.append(doc.doc_id)
            raise
        return doc

    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        panel = await push_download_panel(app, pilot, tmp_path, listing, download)
        await pilot.press("d")
        await wait_until(started.is_set, pilot=pilot, what="the first download")
        await pilot.press("down", "d")
        await wait_until(lambda: any(DOWNLOAD_WAITING in n for n in notes(app)), pilot=pilot, what="the second waiting")
        await pilot.press("escape")
        expected = {f"Download of first.md {DOWNLOAD_STOPPED}", f"Download of second.md {DOWNLOAD_STOPPED}"}
        await wait_until(lambda: expected <= set(notes(app)), pilot=pilot, what="both stops notified")
        assert stopped == ["d1"] and app.screen is not panel
        assert "press d on it in the knowledge panel to resume" in DOWNLOAD_STOPPED
        # the app quitting while a panel download runs: stopped too, and nothing fails
        started.clear()
        panel = await push_download_panel(app, pilot, tmp_path, listing, download)
        await pilot.press("d")
        await wait_until(started.is_set, pilot=pilot, what="a download again")
    assert stopped == ["d1", "d1"]     # cancelled with the app, and its notification did not fail the exit


async def test_a_download_to_a_name_ending_in_a_separator_that_is_no_folder_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`kb download DOC -o newdir/` wrote a file named newdir (Path() drops the slash); like cp, a name
    ending in a separator means a folder: not an existing one is WRITE_FAILED before anything is fetched."""
    content = _document("runbook", 200)
    (tmp_path / "runbook.md").write_bytes(content)
    async with v3_server(tmp_path / "srv") as (_, (host, port)):
        async with Client(host, port) as c:
            doc = await kbclient.upload(c, tmp_path / "runbook.md")
            seen = _requests(c)
            for dest in (f"{tmp_path / 'newdir'}/", f"{tmp_path / 'runbook.md'}/"):   # missing; a file
                with pytest.raises(ClientError) as info:
                    await kbclient.download(c, doc.doc_id, dest)
                assert info.value.code is ClientCode.WRITE_FAILED and "not a folder" in info.value.message
            assert MsgType.KB_DOWNLOAD not in [t for t, _ in seen]
            (tmp_path / "dl").mkdir()
            await kbclient.download(c, doc.doc_id, f"{tmp_path / 'dl'}/")      # an existing folder: into it
            assert (tmp_path / "dl" / "runbook.md").read_bytes() == content
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["--host", host, "--port", str(port), "kb", "download", "runbook.md",
                                              "-o", f"{tmp_path / 'newdir'}/"])
        assert code == 2
        assert f"cannot write {tmp_path / 'newdir'}/: not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dl", "runbook.md", "srv"]    # no newdir, no newdir.part

"""Review s33 of the TUI, against real servers: ctrl+s export is atomic (a full disk leaves the old
file) and follows the folder rules of ``kb download -o``; the Knowledge panel downloads a document
whose name is too long for a file name (shortened, and said so) and caps the name column; ctrl+r /
f5 while an answer streams are refused here, and a refusal never sticks under the live answer; the
sidebar's running mark goes when the connection is lost; the Help screen keeps the keys readable
on a narrow terminal; the saved input history caps what it keeps per input."""
from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

from textual.widgets import DataTable, Input, Markdown

from client import files, kb as kbclient, paths
from client.config import ClientConfig
from client.connection import Client
from client.kb_cli import local_name
from client.tui import commands
from client.tui.app import NpltApp
from client.tui.controller import REDO_WHILE_LIVE
from client.tui.editor import TextEditModal
from client.tui.knowledge import NAME_MAX_CELLS, KnowledgeScreen
from client.tui.modals import ConfirmModal, ExportModal, HelpScreen
from client.tui.saved import MAX_SAVED_INPUT_CHARS, SavedState
from client.tui.sidebar import Sidebar
from client_testlib import SIZE, chat, open_app, shown, type_and_send, v3_server, wait_until
from testkit.echo_agent import EchoAgent
from tui_script import notes

OLD = "my important notes: keep me\n"
LONG = "备" * 200 + ".md"            # 603 UTF-8 bytes: no file system takes it as a file name


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(files.TEMP_PREFIX))


async def export_to(app: NpltApp, pilot: Any, path: str) -> None:
    """ctrl+s, the path typed, Enter."""
    await pilot.press("ctrl+s")
    await wait_until(lambda: shown(app, ExportModal), pilot=pilot, what="the export dialog")
    box = app.screen.query_one("#export-path", Input)
    box.value = path
    box.focus()
    await pilot.press("enter")


# -- 1, 2. export -------------------------------------------------------------------------------------------
async def test_an_export_replacing_a_file_on_a_full_disk_keeps_the_old_file(tmp_path: Path, monkeypatch: Any) -> None:
    notes_file = tmp_path / "notes.md"
    notes_file.write_text(OLD)

    def full_disk(fd: int, data: bytes) -> None:
        os.write(fd, data[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    async with v3_server(tmp_path / "srv") as (_, addr), open_app(addr) as (app, pilot):
        monkeypatch.setattr(files, "_write_all", full_disk)
        await export_to(app, pilot, str(notes_file))
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the replace question")
        await pilot.click("#confirm-yes")
        await wait_until(lambda: any("Export failed" in n for n in notes(app)), pilot=pilot, what="the failure")
        assert any(n == f"Export failed: cannot write {notes_file}: No space left on device" for n in notes(app))
        assert notes_file.read_text() == OLD and leftovers(tmp_path) == []
        monkeypatch.undo()
        await export_to(app, pilot, str(notes_file))
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the replace question")
        await pilot.click("#confirm-yes")
        await wait_until(lambda: f"Exported to {notes_file}" in notes(app), pilot=pilot, what="the export")
        assert notes_file.read_text() != OLD and leftovers(tmp_path) == []


async def test_an_export_path_naming_a_folder(tmp_path: Path) -> None:
    async with v3_server(tmp_path / "srv") as (_, addr), open_app(addr) as (app, pilot):
        sid = chat(app).session_id
        missing = tmp_path / "nosuchdir"
        await export_to(app, pilot, f"{missing}/")
        await wait_until(lambda: any("Export failed" in n for n in notes(app)), pilot=pilot, what="the refusal")
        assert f"Export failed: cannot write {missing}/: not a folder" in notes(app)
        assert not missing.exists()                  # before: a FILE named nosuchdir
        folder = tmp_path / "exports"
        folder.mkdir()
        await export_to(app, pilot, str(folder))     # no "already exists. Replace it?" for a folder
        target = folder / f"nplt-{sid}.md"
        await wait_until(lambda: f"Exported to {target}" in notes(app), pilot=pilot, what="the export")
        assert target.is_file() and not any(isinstance(s, ConfirmModal) for s in app.screen_stack)


# -- 3. a document name too long for a file name ---------------------------------------------------------
async def test_the_knowledge_panel_downloads_a_document_whose_name_is_too_long(tmp_path: Path) -> None:
    source = tmp_path / "long.md"
    source.write_text("# long name doc\n\nsome unique text 42\n")
    async with v3_server(tmp_path / "srv") as (_, addr):
        async with Client(*addr) as c:
            doc = await kbclient.upload(c, source, name=LONG)
        async with open_app(addr) as (app, pilot):
            await pilot.press("f12")
            await wait_until(lambda: shown(app, KnowledgeScreen) and app.screen.loaded, pilot=pilot, what="the panel")
            panel = app.screen
            table = panel.query_one("#kb-table", DataTable)
            table.focus()
            await pilot.pause()
            name_width = next(iter(table.columns.values())).get_render_width(table)
            assert name_width <= NAME_MAX_CELLS + 2       # (cell padding): the other columns stay in view
            assert panel.selected is not None and panel.selected.doc_id == doc.doc_id
            await pilot.press("d")
            name, shortened = local_name(doc)
            dest = paths.export_dir() / name
            await wait_until(lambda: any(n.startswith(f"Downloaded to {dest}") for n in notes(app)), pilot=pilot,
                             what="the download")
            assert shortened and dest.read_bytes() == source.read_bytes() and len(name.encode()) <= 255
            assert any("too long for a file name" in n for n in notes(app))


# -- 5. regenerate / edit while an answer streams -------------------------------------------------------
async def test_regenerate_and_edit_while_an_answer_streams_are_refused_here(tmp_path: Path) -> None:
    echo = EchoAgent()
    async with v3_server(tmp_path / "srv", agent=echo) as (_, addr), open_app(addr) as (app, pilot):
        try:
            await type_and_send(pilot, "!block a slow question")
            await echo.wait_blocked()
            await wait_until(lambda: bool(chat(app).live), pilot=pilot, what="the answer streaming")
            await pilot.press("ctrl+r")
            await wait_until(lambda: REDO_WHILE_LIVE in notes(app), pilot=pilot, what="the refusal")
            await pilot.press("f5")
            await wait_until(lambda: notes(app).count(REDO_WHILE_LIVE) == 2, pilot=pilot, what="the second refusal")
            assert not shown(app, TextEditModal)
            # a refusal by the server that comes while the answer runs (a regenerate sent just before it
            # started): a notification, no line under the live answer
            app.controller.spawn(app.controller.regenerate(), "redo")
            await wait_until(lambda: any(n.startswith("QUEUE_FULL") for n in notes(app)), pilot=pilot,
                             what="the server's refusal")
            assert not chat(app).query(".error")
        finally:
            echo.release()
        await wait_until(lambda: not chat(app).live and app.controller._loads == 0, pilot=pilot, what="the end")
        await pilot.pause()
        assert not chat(app).query(".error") and not any(v.has_class("-error") for v in chat(app).messages())
        assert chat(app).messages()[-1].content == "echo: !block a slow question"


# -- 8. the sidebar's running mark, the Help screen, the saved inputs -------------------------------------------
class Proxy:
    """A loopback proxy to the server; ``kill`` drops every connection and stops listening, as a
    killed server does (the client's reconnects are refused)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[:2]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        self.writers += [client_w, server_w]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.transport.abort()
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    async def kill(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()


async def test_the_running_mark_goes_when_the_connection_is_lost(tmp_path: Path) -> None:
    echo = EchoAgent()
    async with v3_server(tmp_path / "srv", agent=echo) as (_, addr):
        async with Client(*addr) as c:
            sid = (await c.session_new()).session.session_id
        proxy = Proxy(addr)
        host, port = await proxy.start()
        app = NpltApp(ClientConfig(host=host, port=port, reconnect_initial_s=0.05, reconnect_max_s=0.2),
                      state_path=tmp_path / "state.json")
        try:
            async with app.run_test(size=SIZE) as pilot:
                sidebar = app.query_one(Sidebar)
                await wait_until(lambda: app.client.connected and chat(app).session_id == sid and sid in sidebar.sessions,
                                 pilot=pilot, what="the session listed")
                await type_and_send(pilot, "!block long answer")
                await echo.wait_blocked()
                await wait_until(lambda: sidebar.sessions[sid].running, pilot=pilot, what="the running mark")
                assert "⟳" in str(sidebar.list.get_option(sid).prompt)
                await proxy.kill()                       # the server is gone: no reconnect can tell
                await wait_until(lambda: not sidebar.sessions[sid].running, pilot=pilot, what="the mark cleared")
                assert "⟳" not in str(sidebar.list.get_option(sid).prompt) and not app.client.connected
        finally:
            echo.release()
            await proxy.kill()


async def test_the_help_screen_keeps_the_keys_readable_on_a_narrow_terminal(tmp_path: Path) -> None:
    rows = commands.help_rows({})
    async with v3_server(tmp_path / "srv") as (_, addr), open_app(addr) as (app, pilot):
        for width, listed in ((40, True), (110, False)):
            await pilot.resize_terminal(width, 10)
            await pilot.press("f1")
            await wait_until(lambda: shown(app, HelpScreen), pilot=pilot, what="the help")
            screen = app.screen
            await pilot.pause()
            table, lines = screen.query_one("#help-text", Markdown), screen.query_one("#help-list", Markdown)
            assert (table.display, lines.display) == (not listed, listed)
            if listed:   # every binding's keys, whole, as the footer shows them
                for bid, keys, _ in rows:
                    assert f"- {screen.key_display(keys)}:" in lines.source, bid
            await pilot.press("escape")
            await wait_until(lambda: not isinstance(app.screen, HelpScreen), pilot=pilot, what="closed")


def test_the_saved_inputs_keep_only_inputs_up_to_the_cap(tmp_path: Path) -> None:
    state = tmp_path / "tui.json"
    huge = "x" * (MAX_SAVED_INPUT_CHARS + 1)
    edge = "y" * MAX_SAVED_INPUT_CHARS
    saved = SavedState.update(state, added=["short", huge, edge])
    assert saved.history == ["short", edge] and SavedState.load(state).history == ["short", edge]
    assert state.stat().st_size < 2 * MAX_SAVED_INPUT_CHARS
    state.write_text('{"theme": null, "history": ["old", "%s"]}' % huge)    # an older, bigger file
    assert SavedState.load(state).history == ["old"]

"""The TUI's knowledge base (issue 14 item 6): the Knowledge panel with upload (path completion, a
progress bar per file), download and delete against a real server with a knowledge base on loopback;
citations under answers opening their passage, against the fake client."""
from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.widgets import DataTable, Input, ProgressBar

from client import paths
from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.citations import CitationList, PassageModal
from client.tui.knowledge import KnowledgeOps, KnowledgeScreen, Transfer, complete_path
from client.tui.modals import ConfirmModal
from client_testlib import shown, SIZE, chat, wait_until
from fake_client import FakeClient, stamp
from kb_wire.kbwire import kb_server, token
from protocol.kb import KbDocument, KbHit
from protocol.objects import ChatMessage

RUNBOOK = "# Restore\n\nThe restore timeout defaults to 300 seconds.\n\n" + "".join(
    f"## Step {i}\n\nRun step {i} of the restore and check the worker log.\n\n" for i in range(400))


def test_path_completion(tmp_path: Path) -> None:
    (tmp_path / "runbook.md").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / ".hidden").write_text("x")
    assert complete_path(str(tmp_path / "run")) == str(tmp_path / "runbook.md")
    assert complete_path(str(tmp_path / "no")) == str(tmp_path / "notes") + "/"
    assert complete_path(str(tmp_path) + "/") in (str(tmp_path / "notes") + "/", str(tmp_path / "runbook.md"))
    assert complete_path(str(tmp_path / ".hi")) == str(tmp_path / ".hidden")
    assert complete_path(str(tmp_path / "zzz")) is None and complete_path("") is None
    assert complete_path(str(tmp_path / "missing" / "x")) is None


async def test_upload_list_download_delete(tmp_path: Path) -> None:
    src = tmp_path / "runbook.md"
    src.write_text(RUNBOOK, encoding="utf-8")
    async with kb_server(tmp_path / "srv") as (_srv, (host, port)):
        app = NpltApp(ClientConfig(host=host, port=port, token=token("alice")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(lambda: app.client.connected and app.controller._loads == 0,   # no session: none needed
                             pilot=pilot, what="the connection")
            await pilot.press("f11")   # Upload: the panel opens with the path input focused
            await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded, pilot=pilot,
                             what="the knowledge panel")
            panel = app.screen
            box = panel.query_one("#kb-path", Input)
            assert box.has_focus and "No documents" in str(panel.query_one("#kb-info").render())
            await pilot.press(*str(tmp_path / "runb"))
            await wait_until(lambda: box._suggestion == str(src), pilot=pilot, what="the completed file name")
            await pilot.press("right")   # accept the completion
            assert box.value == str(src)
            await pilot.press("enter")
            await wait_until(lambda: bool(panel.query(Transfer)), pilot=pilot, what="the file's progress row")
            row = panel.query_one(Transfer)
            await wait_until(lambda: "done" in str(row.query_one("Label").render()) and len(panel.documents) == 1,
                             pilot=pilot, what="the uploaded document listed")
            assert row.query_one(ProgressBar).percentage == 1
            assert "chunks" in str(row.query_one("Label").render())
            assert row.stages[0] == "receiving" and row.stages[-1] == "indexing"   # bytes, then the stages
            doc = panel.documents[0]
            assert doc.name == "runbook.md" and doc.size == len(RUNBOOK.encode()) and doc.chunks > 0
            table = panel.query_one("#kb-table", DataTable)
            assert table.row_count == 1
            assert [str(c) for c in table.get_row_at(0)][:4] == ["runbook.md", "26.4 KiB", str(doc.chunks),
                                                                 doc.collection]
            table.focus()
            await pilot.press("d")
            dest = paths.export_dir() / "runbook.md"
            await wait_until(lambda: dest.exists() and not dest.with_name("runbook.md.part").exists(), pilot=pilot,
                             what="the downloaded file")
            assert dest.read_text(encoding="utf-8") == RUNBOOK
            await pilot.press("delete")
            await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete question")
            await pilot.press("y")
            await wait_until(lambda: app.screen is panel and panel.loaded and not panel.documents
                             and table.row_count == 0, pilot=pilot, what="the deleted document gone")


async def test_a_refused_upload_shows_on_its_row(tmp_path: Path) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    async with kb_server(tmp_path / "srv") as (_srv, (host, port)):
        app = NpltApp(ClientConfig(host=host, port=port, token=token("alice")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(lambda: app.client.connected and app.controller._loads == 0, pilot=pilot)
            await app.run_action("knowledge")
            await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded, pilot=pilot)
            panel = app.screen
            panel.query_one("#kb-path", Input).value = str(binary)
            await app.run_action("upload")   # from the palette: focuses the path input
            await pilot.press("enter")
            await wait_until(lambda: bool(panel.query(Transfer))
                             and "failed" in str(panel.query_one(Transfer).query_one("Label").render()),
                             pilot=pilot, what="the refusal")
            assert "UNSUPPORTED_MEDIA" in str(panel.query_one(Transfer).query_one("Label").render())
            assert not panel.documents


async def test_citations_under_an_answer_open_the_passage() -> None:
    cites = [{"citation": "[runbook.md §Restore]", "doc_id": "d1", "name": "runbook.md", "chunk_id": "c1",
              "location": {"heading": "Restore"}}]
    fake = FakeClient(messages={"s1": [ChatMessage(1, "user", "restore timeout?", stamp(1)),
                                       ChatMessage(2, "assistant", "300 seconds [runbook.md §Restore]", stamp(2),
                                                   metadata={"citations": cites})]})
    fake.passages["c1"] = KbHit("d1", "runbook.md", "c1", "The restore timeout defaults to 300 seconds.", 1.0,
                                {"heading": "Restore", "lines": "3-3"}, "user:alice", "[runbook.md §Restore]")
    app = NpltApp(ClientConfig(), client=fake)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        sources = chat(app).by_id[2].query_one(CitationList)
        button = sources.query_one(".citation")
        assert str(button.label) == "[runbook.md §Restore]"
        button.press()
        await wait_until(lambda: isinstance(app.screen, PassageModal) and bool(app.screen.query("#passage-text")),
                         pilot=pilot, what="the passage, mounted (pushed is not yet composed)")
        assert "300 seconds" in str(app.screen.query_one("#passage-text").render())
        assert ("KB_PASSAGE", {"chunk_id": "c1"}) in fake.calls
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, PassageModal), pilot=pilot)


async def test_files_entered_during_an_upload_wait_their_turn(tmp_path: Path) -> None:
    files = [tmp_path / f"notes{i}.md" for i in range(3)]
    for i, f in enumerate(files):
        f.write_text(f"# Notes {i}\n\n" + RUNBOOK, encoding="utf-8")
    async with kb_server(tmp_path / "srv") as (_srv, (host, port)):
        app = NpltApp(ClientConfig(host=host, port=port, token=token("alice")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(lambda: app.client.connected and app.controller._loads == 0, pilot=pilot)
            await pilot.press("f11")
            await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded, pilot=pilot)
            panel = app.screen
            box = panel.query_one("#kb-path", Input)
            for f in files:
                box.value = str(f)
                await pilot.press("enter")
            await wait_until(lambda: len(panel.query(Transfer)) == 3 and len(panel.documents) == 3
                             and all("done" in str(r.query_one("Label").render()) for r in panel.query(Transfer)),
                             pilot=pilot, what="three uploads done")
            for row in panel.query(Transfer):   # each had its own progress, bytes first
                assert row.stages[0] in ("receiving", "waiting for the upload before it")
                assert "receiving" in row.stages and row.stages[-1] == "indexing"


async def test_f11_in_the_open_knowledge_panel_focuses_the_path_input() -> None:
    fake = FakeClient()
    app = NpltApp(ClientConfig(), client=fake)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: fake.connected and chat(app).session_id is not None, pilot=pilot, what="the session")
        await pilot.press("f12")
        await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded, pilot=pilot,
                         what="the knowledge panel")
        panel = app.screen
        box = panel.query_one("#kb-path", Input)
        panel.query_one("#kb-table", DataTable).focus()
        await wait_until(lambda: not box.has_focus, pilot=pilot, what="the focus on the list")
        await pilot.press("f11")
        await wait_until(lambda: box.has_focus, pilot=pilot, what="the path input focused")
        await pilot.press(*"notes.md")
        assert box.value == "notes.md" and app.screen is panel


async def test_an_upload_of_one_chunk_says_chunk(tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    note.write_text("# One short note\n", encoding="utf-8")
    stored: list[KbDocument] = []

    async def listing() -> list[KbDocument]:
        return list(stored)

    async def upload(path: Path, progress) -> KbDocument:
        progress("indexing", 1, 1)
        stored.append(KbDocument("d1", path.name, "m", "s", 17, 1, "user:me", stamp(1), "me"))
        return stored[-1]

    async def unused(*_args) -> KbDocument:
        raise AssertionError("not called")
    panel = KnowledgeScreen(KnowledgeOps(listing, upload, unused, unused, tmp_path), upload_first=True)
    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(panel)
        await wait_until(lambda: panel.loaded, pilot=pilot, what="the panel")
        panel.query_one("#kb-path", Input).value = str(note)
        await pilot.press("enter")
        await wait_until(lambda: bool(panel.query(Transfer))
                         and "done" in str(panel.query_one(Transfer).query_one("Label").render())
                         and "1 document" == str(panel.query_one("#kb-info").render()), pilot=pilot,
                         what="the upload done and listed")
        assert str(panel.query_one(Transfer).query_one("Label").render()) == "note.md · done, 1 chunk"

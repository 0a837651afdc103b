"""The Knowledge panel's delete of a group document another member uploaded too (review s32,
tui-kept): the server keeps it for them and says so in the KB_DELETE reply (``kept_for``,
docs/protocol.md §5.8). Before, the panel dropped the reply: it asked "Its passages are no longer
found or cited.", then notified "Deleted “NAME”" while the refreshed list showed the document again.
Now the question says a group document stays with a member who uploaded the same bytes, and the
notice says the caller's upload was withdrawn and whom the document was kept for."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textual.app import App
from textual.widgets import DataTable

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.knowledge import KnowledgeOps, KnowledgeScreen
from client.tui.modals import ConfirmModal
from client_testlib import SIZE, shown, wait_until
from fake_client import FakeClient, stamp
from kb_wire.kbwire import connect, kb_server, raw_upload, token
from protocol import MsgType
from protocol.kb import KbDeleteReply, KbDocument
from tui_script import notes

MATRIX = b"# Escalation\n\nThe escalation matrix: on-call first, then the team lead, then the director.\n"
KEPT = "Withdrew your upload of “matrix.md”; kept for carol, who uploaded the same bytes"


def _doc(collection: str, uploader: str = "alice") -> KbDocument:
    return KbDocument("d1", "matrix.md", "m", "s", len(MATRIX), 1, collection, stamp(1), uploader)


def _question(app: App[Any]) -> str:
    return str(app.screen.query_one(".question").render())


async def _panel(app: App[Any], pilot: Any, ops: KnowledgeOps) -> KnowledgeScreen:
    panel = KnowledgeScreen(ops)
    await app.push_screen(panel)
    await wait_until(lambda: panel.loaded and panel.query_one("#kb-table", DataTable).row_count == 1, pilot=pilot,
                     what="the panel with its document")
    panel.query_one("#kb-table", DataTable).focus()
    return panel


async def _unused(*_args: Any) -> Any:
    raise AssertionError("not called")


async def test_a_group_document_kept_for_a_co_uploader_is_said_so_and_stays_listed(tmp_path: Path) -> None:
    listed = [_doc("group:red")]
    lists: list[int] = []

    async def listing() -> list[KbDocument]:
        lists.append(1)
        return list(listed)

    async def delete(doc_id: str) -> KbDeleteReply:
        listed[0] = _doc("group:red", uploader="carol")   # the server keeps it: carol's now
        return KbDeleteReply(re=None, doc_id=doc_id, kept_for="carol")
    app = NpltApp(ClientConfig(), client=FakeClient())  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        panel = await _panel(app, pilot, KnowledgeOps(listing, _unused, _unused, delete, tmp_path))
        await pilot.press("delete")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete question")
        question = _question(app)
        assert "unless another member of group:red uploaded the same bytes: then it stays theirs" in question
        assert "only your upload is withdrawn" in question
        before = len(lists)
        await pilot.press("y")
        await wait_until(lambda: KEPT in notes(app), pilot=pilot, what="the kept-for notice")
        assert not any(n.startswith("Deleted") for n in notes(app))   # before: "Deleted “matrix.md”"
        await wait_until(lambda: len(lists) > before and panel.loaded and panel.documents == listed, pilot=pilot,
                         what="the list refreshed")
        assert panel.query_one("#kb-table", DataTable).row_count == 1   # the row stays: the document is carol's
        assert panel.documents[0].uploader == "carol"


async def test_a_removed_document_is_still_deleted_and_a_personal_one_asked_plainly(tmp_path: Path) -> None:
    listed = [_doc("user:alice")]

    async def listing() -> list[KbDocument]:
        return list(listed)

    async def delete(doc_id: str) -> KbDeleteReply:
        listed.clear()
        return KbDeleteReply(re=None, doc_id=doc_id)       # no kept_for: removed
    app = NpltApp(ClientConfig(), client=FakeClient())  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        panel = await _panel(app, pilot, KnowledgeOps(listing, _unused, _unused, delete, tmp_path))
        await pilot.press("delete")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete question")
        assert _question(app) == ("Delete document “matrix.md” from the knowledge base? Its passages are no "
                                  "longer found or cited.")
        await pilot.press("y")
        await wait_until(lambda: "Deleted “matrix.md”" in notes(app) and not panel.documents
                         and panel.query_one("#kb-table", DataTable).row_count == 0, pilot=pilot,
                         what="the document deleted")
        assert not any("kept for" in n for n in notes(app))


async def test_end_to_end_alice_deletes_what_carol_uploaded_too(tmp_path: Path) -> None:
    """A real server, alice and carol in group red with the same bytes uploaded: alice's delete in
    the TUI is said to be kept for carol, the list still shows it; carol's own delete then removes it."""
    async with kb_server(tmp_path / "srv") as (_srv, addr):
        alice, carol = await connect(addr, "alice"), await connect(addr, "carol")
        mine = (await raw_upload(alice, "matrix.md", MATRIX, collection="group:red"))["document"]
        dup = (await raw_upload(carol, "copy.md", MATRIX, collection="group:red"))["document"]
        assert dup["duplicate"] and dup["doc_id"] == mine["doc_id"]
        await alice.close()
        app = NpltApp(ClientConfig(host=addr[0], port=addr[1], token=token("alice")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(lambda: app.client.connected and app.controller._loads == 0, pilot=pilot,
                             what="the connection")
            await pilot.press("f12")
            await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded
                             and len(app.screen.documents) == 1, pilot=pilot, what="the knowledge panel")
            panel = app.screen
            table = panel.query_one("#kb-table", DataTable)
            table.focus()
            await pilot.press("delete")
            await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete question")
            assert "unless another member of group:red uploaded the same bytes" in _question(app)
            await pilot.press("y")
            await wait_until(lambda: KEPT in notes(app), pilot=pilot, what="the kept-for notice")
            await wait_until(lambda: app.screen is panel and panel.loaded and len(panel.documents) == 1
                             and panel.documents[0].uploader == "carol", pilot=pilot,
                             what="the list refreshed: the document is carol's")
            assert table.row_count == 1 and not any(n.startswith("Deleted") for n in notes(app))
        [doc] = (await carol.call(MsgType.KB_LIST, collection="group:red"))["documents"]
        assert (doc["doc_id"], doc["uploader"]) == (mine["doc_id"], "carol")
        reply = await asyncio.wait_for(carol.call(MsgType.KB_DELETE, doc_id=mine["doc_id"]), 15)
        assert reply["deleted"] is True and "kept_for" not in reply
        await carol.close()


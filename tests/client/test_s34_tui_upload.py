"""Review s34 of the Knowledge panel: a refused upload's row kept an animated indeterminate bar, as if
it still ran, and on a small terminal the row was below the fold with nothing said. Now a failed
row has no bar, is scrolled into view, and the refusal is notified (a real KB server on loopback)."""
from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, ProgressBar

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.knowledge import KnowledgeScreen, Transfer
from client_testlib import wait_until
from kb_wire.kbwire import kb_server, token
from tui_script import notes


async def test_a_refused_upload_has_no_bar_and_is_said_on_a_small_terminal(tmp_path: Path) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    async with kb_server(tmp_path / "srv") as (_srv, (host, port)):
        app = NpltApp(ClientConfig(host=host, port=port, token=token("alice")))
        async with app.run_test(size=(40, 20)) as pilot:
            await wait_until(lambda: app.client.connected and app.controller._loads == 0, pilot=pilot)
            await app.run_action("knowledge")
            await wait_until(lambda: isinstance(app.screen, KnowledgeScreen) and app.screen.loaded, pilot=pilot)
            panel = app.screen
            panel.query_one("#kb-path", Input).value = str(binary)
            await app.run_action("upload")
            await pilot.press("enter")
            await wait_until(lambda: bool(panel.query(Transfer)) and panel.query_one(Transfer).job.failed,
                             pilot=pilot, what="the refusal")
            row = panel.query_one(Transfer)
            await wait_until(lambda: not row.query_one(ProgressBar).display, pilot=pilot, what="no bar")
            await wait_until(lambda: any("blob.bin" in n and "UNSUPPORTED_MEDIA" in n for n in notes(app)),
                             pilot=pilot, what="the refusal said")
            await pilot.pause()
            assert row.query_one(ProgressBar).display is False

"""A file tool call is shown in the TUI like the other tools: Textual Pilot against a real server running the
offline agent with a file root."""
from __future__ import annotations

import time
from pathlib import Path

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.input import ChatInput
from client.tui.toolcall import ToolCallItem
from server.agent.config import AgentConfig
from server.agent.offline import OfflineAgent
from server.tools import ToolRegistry, ToolsConfig
from testkit.server import running_server


async def wait_until(pred, pilot, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


async def test_search_files_call_is_shown_as_a_tool_item(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "app.log").write_text("ok\nERROR disk full\n")
    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(file_roots=[str(files)])))
    async with running_server(tmp_path, agent=agent) as (_, (host, port)):
        app = NpltApp(ClientConfig(host=host, port=port, reconnect_initial_s=0.05, reconnect_max_s=0.2),
                      state_path=tmp_path / "tui-state.json")          # never the user's own saved inputs
        async with app.run_test(size=(110, 40)) as pilot:
            await wait_until(lambda: app.client.connected and app.client.hello is not None,   # a fresh server:
                             pilot, "the connection")                 # no session until the first message
            box = app.query_one(ChatInput)
            box.focus()
            box.load_text("grep ERROR in app.log")
            await pilot.press("enter")
            await wait_until(lambda: any(i.status == "success" for i in app.query(ToolCallItem)), pilot,
                             "the finished tool item")
            item = app.query_one(ToolCallItem)
            assert item.call.tool_name == "search_files" and item.call.arguments["pattern"] == "ERROR"
            assert "ERROR disk full" in item.call.result

"""Session 33: a bare file name found under a log root is found by read_file and search_files too.

"tail app.log" found ``app.log`` under a ``[tools] log_roots`` entry while "app.log 里有没有 ERROR" (an
example of docs/agent.md) answered "找不到文件或目录：“app.log”": the file tools looked for a relative
name under ``file_roots`` only and their miss did not say where they had looked. Now read_file and
search_files look under each file root in order, then each log root (whose files read_log reads
already); a name found as two different entries under two roots is refused as ambiguous, naming both;
a miss names the roots looked under. Every other check stays (secret names, the server's own data,
symlinks out of a root, pseudo filesystems), and without file_roots the file tools stay disabled.
Real files in tmp roots, through the tool registry, the offline agent and a real server over loopback.
"""
from __future__ import annotations

import os

import orjson
import pytest

from protocol import MsgType
from server.agent.base import BuiltContext, TurnRequest
from server.agent.config import AgentConfig
from server.agent.offline import OfflineAgent
from server.app import Server
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.paths import Protected
from storage.models import ChatMessage
from testkit.server import V3Client, answer_text, make_config

CTX = ToolContext("alice", "s_1")
T = MsgType


@pytest.fixture
def tree(tmp_path):
    """The reviewer's layout: one file root holding two log roots; app.log is only under a log root."""
    t = tmp_path / "tree"
    (t / "logs" / "nginx").mkdir(parents=True)
    (t / "app").mkdir()
    (t / "etc").mkdir()
    (t / "app" / "app.log").write_text("10:00 INFO start\n11:00 ERROR db timeout\n12:00 INFO ok\n")
    (t / "app" / ".env").write_text("DB_PASSWORD=hunter2\n")
    (t / "logs" / "nginx" / "error.log").write_text("a\nupstream timed out\n")
    (t / "etc" / "config.yaml").write_text("port: 8080\n")
    return t


def tools_for(tree, **kw) -> ToolRegistry:
    return ToolRegistry(ToolsConfig(file_roots=[str(tree)], log_roots=[str(tree / "logs"), str(tree / "app")], **kw))


async def run(tools, name, **args):
    call = await tools.run(name, args, CTX)
    return call.status, orjson.loads(call.result)


async def test_a_bare_name_under_a_log_root_is_searched_and_read(tree):
    tools = tools_for(tree)
    try:
        status, d = await run(tools, "read_log", path="app.log")          # (as before)
        assert status == "success" and d["path"] == str(tree / "app" / "app.log")
        status, d = await run(tools, "search_files", root="app.log", pattern="ERROR")
        assert status == "success", d
        assert d["root"] == str(tree / "app" / "app.log")
        assert d["matches"] == [{"path": "app.log", "line": 2, "text": "11:00 ERROR db timeout"}]
        status, d = await run(tools, "read_file", path="app.log")
        assert status == "success" and d["path"] == str(tree / "app" / "app.log") and d["lines_returned"] == 3
        status, d = await run(tools, "search_files", root="nginx", pattern="timed out")   # a directory of a log root
        assert status == "success" and d["matches"] == [{"path": "error.log", "line": 2, "text": "upstream timed out"}]
        status, d = await run(tools, "read_file", path="etc/config.yaml")                # a file root first, as before
        assert status == "success" and d["text"] == "port: 8080"
    finally:
        tools.close()


async def test_a_log_root_outside_the_file_roots_is_readable_by_its_absolute_path(tmp_path):
    files, logs = tmp_path / "etc", tmp_path / "var" / "log"
    files.mkdir()
    logs.mkdir(parents=True)
    (logs / "app.log").write_text("ERROR one\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(files)], log_roots=[str(logs)]))
    try:
        status, d = await run(tools, "search_files", root="app.log", pattern="ERROR")
        assert status == "success" and d["root"] == str(logs / "app.log") and d["returned"] == 1
        # the path a result gives can be used again as it is
        status, d = await run(tools, "read_file", path=d["root"])
        assert status == "success" and d["text"] == "ERROR one"
        status, d = await run(tools, "search_files", root=str(logs), pattern="ERROR")
        assert status == "success" and d["matches"] == [{"path": "app.log", "line": 1, "text": "ERROR one"}]
        # list_dir keeps to the file roots
        status, d = await run(tools, "list_dir", path=str(logs))
        assert status == "error" and d["error"] == f"path '{logs}' is outside the allowed file directories"
        # a path under neither is still refused
        status, d = await run(tools, "read_file", path=str(tmp_path / "var"))
        assert status == "error" and d["error"] == f"path '{tmp_path / 'var'}' is outside the allowed file directories"
    finally:
        tools.close()


async def test_a_miss_names_the_roots_looked_under(tree):
    tools = tools_for(tree)
    roots = f"{tree}, {tree / 'logs'}, {tree / 'app'}"
    try:
        status, d = await run(tools, "search_files", root="missing.log", pattern="x")
        assert status == "error" and d["error"] == f"no such file or directory: 'missing.log' (looked for under {roots})"
        status, d = await run(tools, "read_file", path="missing.log")
        assert status == "error" and d["error"] == f"no such file: 'missing.log' (looked for under {roots})"
        status, d = await run(tools, "read_file", path=str(tree / "missing.log"))     # an absolute path: as before
        assert status == "error" and d["error"] == f"no such file: '{tree / 'missing.log'}'"
        status, d = await run(tools, "read_log", path="missing.log")                   # read_log: as before
        assert status == "error" and d["error"] == "no such log file: 'missing.log'"
    finally:
        tools.close()


async def test_a_name_under_two_roots_is_ambiguous_and_names_both(tree):
    (tree / "app.log").write_text("another app.log, at the file root\n")
    tools = tools_for(tree)
    try:
        for name, args in (("search_files", {"root": "app.log", "pattern": "ERROR"}), ("read_file", {"path": "app.log"})):
            status, d = await run(tools, name, **args)
            assert status == "error" and d["error"] == (
                f"'app.log' is ambiguous: it is found as {tree / 'app.log'}, {tree / 'app' / 'app.log'}; "
                "give the full path"), name
        status, d = await run(tools, "read_file", path=str(tree / "app" / "app.log"))
        assert status == "success" and "ERROR db timeout" in d["text"]
    finally:
        tools.close()


async def test_the_same_file_through_two_roots_is_no_ambiguity(tree):
    os.symlink(tree / "app", tree.parent / "app-link")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tree / "app")],
                                     log_roots=[str(tree / "app"), str(tree.parent / "app-link")]))
    try:
        status, d = await run(tools, "search_files", root="app.log", pattern="ERROR")
        assert status == "success" and d["root"] == str(tree / "app" / "app.log") and d["returned"] == 1
    finally:
        tools.close()


async def test_the_checks_still_hold_under_a_log_root(tree, tmp_path):
    (tmp_path / "outside.log").write_text("ERROR outside\n")
    os.symlink(tmp_path / "outside.log", tree / "logs" / "escape.log")
    server_log = tree / "logs" / "nplt.log"
    server_log.write_text("ERROR the server's own log\n")
    (tree / "etc" / "nplt.log").write_text("ERROR a public file of the same name\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tree / "etc")], log_roots=[str(tree / "logs"), str(tree / "app")]),
                         protected=(Protected(str(server_log), "logging.file"),))
    try:
        status, d = await run(tools, "search_files", root=".env", pattern="PASSWORD")
        assert status == "error" and d["error"] == "'.env' is refused: files named like '.env' may hold secrets and are never read"
        status, d = await run(tools, "read_file", path="escape.log")
        assert status == "error" and d["error"] == "path 'escape.log' resolves outside the allowed file directories"
        status, d = await run(tools, "read_file", path=str(server_log))
        assert status == "error" and "part of the server's own data (logging.file)" in d["error"]
        # the public file is read; the server's own log of the same name is neither read nor told about
        status, d = await run(tools, "search_files", root="nplt.log", pattern="ERROR")
        assert status == "success" and d["root"] == str(tree / "etc" / "nplt.log"), d
        assert [m["text"] for m in d["matches"]] == ["ERROR a public file of the same name"]
        status, d = await run(tools, "search_files", root=str(tree / "logs"), pattern="ERROR")   # a walk skips it
        assert status == "success" and d["matches"] == [] and d["skipped"] == {"symlink_or_special": 1}
    finally:
        tools.close()


async def test_without_file_roots_the_file_tools_stay_disabled(tree):
    tools = ToolRegistry(ToolsConfig(log_roots=[str(tree / "app")]))
    try:
        status, d = await run(tools, "search_files", root="app.log", pattern="ERROR")
        assert status == "error" and d["error"] == (
            "search_files is disabled: no file directories are configured on the server (tools.file_roots)")
        assert "read_file" in tools.disabled and "read_log" not in tools.disabled
    finally:
        tools.close()


def turn(text: str) -> TurnRequest:
    return TurnRequest(session_id="s_1", user_id="alice", model="offline", turn_id="t_1",
                       user_message=ChatMessage(id=1, role="user", content=text),
                       context=BuiltContext(messages=[{"role": "user", "content": text}], metadata={}))


class Sink:
    async def status(self, *a): ...
    async def tool_call(self, *a): ...
    async def tool_result(self, *a): ...
    async def delta(self, *a): ...
    async def notice(self, *a): ...


async def test_the_offline_agent_answers_the_documented_question(tree):
    agent = OfflineAgent(AgentConfig(), tools_for(tree))
    r = await agent.run_turn(turn("app.log 里有没有 ERROR"), Sink())
    assert [c.tool_name for c in r.tool_calls] == ["search_files"] and r.tool_calls[0].status == "success"
    assert r.content.startswith(f"在 {tree / 'app' / 'app.log'} 中找到 1 行匹配“ERROR”") and "db timeout" in r.content
    r = await agent.run_turn(turn("查看 app.log 的内容"), Sink())
    assert r.tool_calls[0].status == "success" and "11:00 ERROR db timeout" in r.content
    r = await agent.run_turn(turn("missing.log 里有没有 ERROR"), Sink())
    assert r.content == (f"搜索文件失败：找不到文件或目录：“missing.log”（查找了：{tree}, {tree / 'logs'}, "
                         f"{tree / 'app'}）。")
    r = await agent.run_turn(turn("grep ERROR in missing.log"), Sink())
    assert r.content == ("The search_files tool could not answer: no such file or directory: 'missing.log' "
                         f"(looked for under {tree}, {tree / 'logs'}, {tree / 'app'})")


async def test_over_a_real_server(tree, tmp_path):
    cfg = make_config(tmp_path, sections={"llm": {}, "tools": {"file_roots": [str(tree)],
                                                               "log_roots": [str(tree / "logs"), str(tree / "app")]}})
    srv = Server(cfg)
    addr = await srv.start()
    try:
        client = await V3Client.connect(addr)
        reply = await client.call(T.CHAT_TEXT, id=client.next_id(), text="app.log 里有没有 ERROR")
        events = await client.turn_events(reply["turn_id"], timeout=30.0)
        assert events[-1].type == T.TURN_END, events[-1].body
        [call] = [ev.body["call"] for ev in events if ev.type == T.TOOL_RESULT]
        assert call["tool_name"] == "search_files" and call["status"] == "success", call
        assert "11:00 ERROR db timeout" in answer_text(events)
        await client.close()
    finally:
        await srv.stop()


def test_the_ambiguity_is_said_in_chinese():
    """The offline agent says the refusal of a name found under two roots in Chinese (before: quoted
    as 原始错误信息)."""
    from server.agent.answers import error_zh
    said = error_zh("'app.log' is ambiguous: it is found as /a/app.log, /b/app.log; give the full path")
    assert said == "“app.log”有多个同名的文件或目录：/a/app.log, /b/app.log；请给出完整路径"

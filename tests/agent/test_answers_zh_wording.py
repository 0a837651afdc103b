"""The offline agent's answers to a Chinese question say nothing in the tools' English: no duration
units ("21h 3m"), no raw ISO timestamps, no role or "session" words, no OS error texts ("connection
refused"); each is written from the tool's fields. Times read the same in both languages
(``2026-11-27 10:40 UTC``); the English answers otherwise keep their wording.

The results come from the real tools (registry.run) where a real one can give them; the rest are
results as the tools write them."""
from __future__ import annotations

import os
import re
import socket
from datetime import datetime, timezone

import orjson
import pytest

from server.agent import answers, memory_answers
from server.agent.config import AgentConfig
from server.agent.offline import OfflineAgent
from server.memory.context import MEMORY_HEADER
from server.memory.user_store import MemoryItem
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from storage.models import SearchHit, ToolCall

from .conftest import RecordingSink, make_request

CTX = ToolContext("alice", "s_now")
MTIME = datetime(2026, 11, 27, 10, 40, 23, tzinfo=timezone.utc).timestamp()
SHOWN = "2026-11-27 10:40 UTC"             # MTIME as every answer says it

_RAW = [re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d"),          # an ISO timestamp
        re.compile(r"[+-]\d\d:\d\d\b"),                    # ... or its offset
        re.compile(r"\b\d+[dhms]\b")]                      # "21h 3m", "42s"
_WORD = re.compile(r"[A-Za-z][\w-]*", re.A)
_ALLOWED = {"UTC", "CPU", "TCP", "pid", "B", "KiB", "MiB", "GiB", "TiB"}


def english_in(answer: str, *data: str) -> list[str]:
    """The ASCII words and raw values left in ``answer`` once the data it quotes (paths, ids, file
    text, what the user said) and its code blocks are taken out."""
    for d in sorted(data, key=len, reverse=True):
        answer = answer.replace(d, " ")
    answer = re.sub(r"```.*?```", " ", answer, flags=re.S)
    words = [w for w in _WORD.findall(answer) if w not in _ALLOWED and "_" not in w]   # (read_file: a name)
    return words + [m.group(0) for r in _RAW for m in r.finditer(answer)]


def result(tool: str, value: dict, status: str = "success") -> ToolCall:
    return ToolCall(id="call_1", tool_name=tool, result=orjson.dumps(value).decode(), status=status)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "logs" / "nginx").mkdir(parents=True)
    (tmp_path / "logs" / "app.log").write_text("line1 INFO start\nline2 ERROR db timeout\n")
    for p in (tmp_path / "logs" / "app.log", tmp_path / "logs" / "nginx"):
        os.utime(p, (MTIME, MTIME))
    return tmp_path / "logs"


@pytest.fixture
def registry(tree):
    items = [MemoryItem("m1", "fact", "The staging server is stage-7.internal", "s_a", 2, "2026-11-20T10:15:30+00:00"),
             MemoryItem("m2", "preference", "以后用中文回答。", "s_b", 4, "2026-11-21T09:00:00+00:00")]

    async def remembered(user_id):
        return items

    async def search(user_id, query, session_id=None, k=5):
        return [SearchHit("s_1", "nginx 排查", 3, "user", "nginx 怎么重启", "2026-11-27T10:54:00+00:00", 2.0),
                {"session_id": "s_2", "title": "", "message_id": 4, "role": "assistant",    # (a memory-layer hit)
                 "time": "2026-11-27T11:00:00+00:00", "snippet": "用 nginx -s reload", "score": 1.0}]
    return ToolRegistry(ToolsConfig(cpu_sample_s=0.05, log_roots=[str(tree)], file_roots=[str(tree)]),
                        search=search, memory_items=remembered)


# -- real tool results, both languages ------------------------------------------------------------------
async def test_network_check_says_the_connect_result_in_chinese(registry):
    port = closed_port()
    call = await registry.run("network_check", {"host": "127.0.0.1", "port": port}, CTX)
    assert answers.render(call, zh=True) == f"127.0.0.1:{port} 无法连通（127.0.0.1：连接被拒绝）。"
    assert answers.render(call, zh=False) == f"127.0.0.1:{port} is not reachable (127.0.0.1: connection refused)."


async def test_uptime_says_its_duration_and_boot_time_in_chinese(registry):
    call = await registry.run("sys_monitor", {"metric": "uptime"}, CTX)
    zh = answers.render(call, zh=True)
    assert re.fullmatch(r"已运行 (\d+ 天 )?(\d+ 小时 )?\d+ (分钟|秒)（开机时间 \d{4}-\d\d-\d\d \d\d:\d\d UTC）。", zh), zh
    assert english_in(zh) == [], zh
    en = answers.render(call, zh=False)
    assert re.fullmatch(r"Uptime: [\dhdms ]+ \(booted \d{4}-\d\d-\d\d \d\d:\d\d UTC\)\.", en), en
    overview = answers.render(await registry.run("sys_monitor", {"metric": "all"}, CTX), zh=True)
    assert "已运行 " in overview and not any(r.search(overview) for r in _RAW), overview


@pytest.mark.parametrize("tool, args, zh, en", [
    ("read_log", {"path": "app.log", "lines": 2},
     f"{{root}}/app.log 的最后 2 行（大小 40 B，修改于 {SHOWN}）：",
     f"Last 2 lines of {{root}}/app.log (40 B, modified {SHOWN}):"),
    ("read_file", {"path": "app.log"},
     f"{{root}}/app.log（大小 40 B，修改于 {SHOWN}），第 1-2 行：",
     f"{{root}}/app.log (40 B, modified {SHOWN}), lines 1-2:"),
    ("list_dir", {"path": "."},
     f"{{root}} 下共 2 项，显示 2 项：\n- app.log（40 B，{SHOWN}）\n- nginx/（目录，{SHOWN}）",
     f"{{root}}: 2 of 2 entries:\n- app.log  (40 B, {SHOWN})\n- nginx/  (dir, {SHOWN})"),
    ("read_file", {"path": "app.log", "offset": 99},
     "读取文件失败：“app.log”只有 2 行，第 99 行已超出文件末尾。",
     "The read_file tool could not answer: 'app.log' has 2 lines; offset 99 is past the end"),
])
async def test_file_answers_say_times_in_one_readable_form_and_errors_in_chinese(registry, tree, tool, args, zh, en):
    call = await registry.run(tool, args, CTX)
    root = str(tree.resolve())
    said_zh, said_en = answers.render(call, zh=True), answers.render(call, zh=False)
    assert said_zh.split("\n```")[0] == zh.format(root=root)
    assert said_en.split("\n```")[0] == en.format(root=root)
    assert english_in(said_zh, root, "app.log", "nginx") == [], said_zh


async def test_memory_listing_says_kind_session_and_time_in_chinese(registry):
    call = await registry.run("user_memory", {}, CTX)
    zh = answers.render(call, zh=True)
    assert zh == ("我记得关于你的 2 条信息（最新的在前）：\n"
                  "- 以后用中文回答。（偏好；会话 s_b，2026-11-21 09:00 UTC）\n"
                  "- The staging server is stage-7.internal（事实；会话 s_a，2026-11-20 10:15 UTC）")
    assert english_in(zh, "The staging server is stage-7.internal", "s_a", "s_b") == []
    assert answers.render(call, zh=False) == (
        "I remember 2 thing(s) about you (newest first):\n"
        "- 以后用中文回答。 (preference; session s_b, 2026-11-21 09:00 UTC)\n"
        "- The staging server is stage-7.internal (fact; session s_a, 2026-11-20 10:15 UTC)")


async def test_history_hits_say_who_and_when_in_chinese(registry):
    call = await registry.run("history_search", {"query": "nginx"}, CTX)
    zh = answers.render(call, zh=True)
    assert zh == ("找到 2 条与“nginx”相关的历史消息：\n"
                  "- [nginx 排查] 你 2026-11-27 10:54 UTC：nginx 怎么重启\n"
                  "- [s_2] 助手 2026-11-27 11:00 UTC：用 nginx -s reload")
    assert english_in(zh, "nginx -s reload", "nginx", "s_2") == []
    assert answers.render(call, zh=False) == ("Found 2 earlier message(s) about 'nginx':\n"
                                              "- [nginx 排查] user 2026-11-27 10:54 UTC: nginx 怎么重启\n"
                                              "- [s_2] assistant 2026-11-27 11:00 UTC: 用 nginx -s reload")


# -- results as the tools write them ----------------------------------------------------------------------
@pytest.mark.parametrize("value, zh, en", [
    ({"uptime": "21h 3m", "uptime_s": 75_780, "boot_time": "2026-11-26T13:52:05+00:00"},
     "已运行 21 小时 3 分钟（开机时间 2026-11-26 13:52 UTC）。", "Uptime: 21h 3m (booted 2026-11-26 13:52 UTC)."),
    ({"uptime": "1d 2h 3m", "uptime_s": 93_784, "boot_time": "2026-11-26T21:52:05+08:00"},
     "已运行 1 天 2 小时 3 分钟（开机时间 2026-11-26 13:52 UTC）。", "Uptime: 1d 2h 3m (booted 2026-11-26 13:52 UTC)."),
    ({"uptime": "42s", "uptime_s": 42, "boot_time": "2026-11-26T13:52:05+00:00"},
     "已运行 42 秒（开机时间 2026-11-26 13:52 UTC）。", "Uptime: 42s (booted 2026-11-26 13:52 UTC)."),
])
def test_uptime_table(value, zh, en):
    call = result("sys_monitor", {"metric": "uptime", "uptime": value})
    assert (answers.render(call, zh=True), answers.render(call, zh=False)) == (zh, en)


def test_every_connect_result_is_said_in_chinese_or_quoted_as_the_original():
    attempts = [("10.0.0.1", "no route to host"), ("10.0.0.2", "timed out"), ("10.0.0.3", "network is unreachable"),
                ("::1", "something new")]
    call = result("network_check", {"host": "db", "port": 5432, "reachable": False, "timeout_s": 3,
                                    "attempts": [{"address": a, "result": r} for a, r in attempts]})
    zh = answers.render(call, zh=True)
    assert zh == ("db:5432 无法连通（10.0.0.1：没有到该主机的路由；10.0.0.2：连接超时；10.0.0.3：网络不可达；"
                  "::1：原始错误信息：something new）。")
    assert english_in(zh, "db", "something new") == []
    assert answers.render(call, zh=False) == ("db:5432 is not reachable (10.0.0.1: no route to host; "
                                              "10.0.0.2: timed out; 10.0.0.3: network is unreachable; "
                                              "::1: something new).")


@pytest.mark.parametrize("error, zh", [
    ("DNS resolution of 'db.internal' failed: Name or service not known", "解析“db.internal”失败（域名无法解析）"),
    ("DNS resolution of 'db.internal' failed: Temporary failure in name resolution",
     "解析“db.internal”失败（域名解析暂时失败）"),
    ("DNS resolution of 'db.internal' failed: Weird resolver error", "解析“db.internal”失败（原始错误信息：Weird resolver error）"),
    ("cannot open '/x/a.log': Input/output error", "无法打开“/x/a.log”（原始错误信息：Input/output error）"),
    ("cannot list '/x': No route to host", "无法列出“/x”（没有到该主机的路由）"),
    ("history search failed (StorageError)", "历史搜索失败（StorageError）"),
    ("downloads are unavailable on this server", "这台服务器不提供下载"),
    ("this server has no knowledge base", "这台服务器没有知识库"),
])
def test_tool_errors_in_chinese(error, zh):
    call = result("network_check", {"error": error}, status="error")
    assert answers.render(call, zh=True) == f"检查端口失败：{zh}。"
    assert answers.render(call, zh=False) == f"The network_check tool could not answer: {error}"


def test_a_time_that_is_no_timestamp_is_shown_as_it_came():
    from server.agent.file_answers import when
    assert (when("2026-11-27T18:40:23+08:00"), when("yesterday"), when(None)) == (SHOWN, "yesterday", "")


# -- the memory answer quotes the memory block's items with their source in the question's language ------
def _context(question: str, *lines: str) -> list[dict]:
    return [{"role": "system", "content": "sys"},
            {"role": "system", "content": MEMORY_HEADER + "\n" + "\n".join(f"- {line}" for line in lines)},
            {"role": "user", "content": question}]


@pytest.mark.parametrize("line, zh", [
    ("我们的备份服务器在杭州机房。 (session s_b, 2026-11-21 09:00 UTC)", "我们的备份服务器在杭州机房。（会话 s_b，2026-11-21 09:00 UTC）"),
    ('我们的备份服务器在杭州机房。 (session "运维 (笔记", 2026-11-21 09:00 UTC)',
     "我们的备份服务器在杭州机房。（会话 “运维 (笔记”，2026-11-21 09:00 UTC）"),
    ("我们的备份服务器在杭州机房。 (session s_b, unknown time)", "我们的备份服务器在杭州机房。（会话 s_b，时间未知）"),
])
def test_a_remembered_item_is_quoted_with_its_source_in_chinese(line, zh):
    question = "我们的备份服务器在哪里？"
    said = memory_answers.answer(question, _context(question, line), zh=True)
    assert said == f"根据你之前告诉我的：\n- {zh}"
    assert english_in(said, "s_b") == []
    assert memory_answers.answer(question, _context(question, line), zh=False) == \
        f"From what you told me earlier:\n- {line}"


# -- through the offline agent: the reviewer's questions ------------------------------------------------
async def test_the_offline_agent_answers_the_reviewers_questions_in_chinese(tree):
    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(log_roots=[str(tree)], file_roots=[str(tree)])))
    port = closed_port()
    for question in (f"检查 127.0.0.1:{port} 端口", "服务器运行时间", f"查看 {tree}/app.log 日志"):
        done = await agent.run_turn(make_request(question, model="offline"), RecordingSink())
        assert [c.status for c in done.tool_calls] == ["success"], done.content
        left = english_in(done.content, str(tree.resolve()), str(tree), "app.log")
        assert left == [], (question, done.content)

"""The offline agent understands file requests in Chinese and English and answers from the real file tools."""
from __future__ import annotations

import time

import pytest

from server.agent.config import AgentConfig
from server.agent.file_intents import parse_file_request
from server.agent.intents import parse
from server.agent.offline import OfflineAgent
from server.tools import ToolRegistry, ToolsConfig

from .conftest import RecordingSink, make_request


@pytest.mark.parametrize("text,expected", [
    ("列出 /var/log/nginx 目录下的文件", ("list_dir", {"path": "/var/log/nginx"})),
    ("列出/tmp目录下的文件", ("list_dir", {"path": "/tmp"})),
    ("/etc/nginx 目录里有哪些文件", ("list_dir", {"path": "/etc/nginx"})),
    ("ls /var/log", ("list_dir", {"path": "/var/log"})),
    ("list files in logs/nginx", ("list_dir", {"path": "logs/nginx"})),
    ("what's in /etc/nginx?", ("list_dir", {"path": "/etc/nginx"})),
    ("查看 config.yaml 的内容", ("read_file", {"path": "config.yaml"})),
    ("查看config.yaml的内容", ("read_file", {"path": "config.yaml"})),
    ("看看 /etc/nginx/nginx.conf", ("read_file", {"path": "/etc/nginx/nginx.conf"})),
    ("cat /etc/hosts", ("read_file", {"path": "/etc/hosts"})),
    ("show me the contents of config.yaml", ("read_file", {"path": "config.yaml"})),
    ("grep ERROR in app.log", ("search_files", {"root": "app.log", "pattern": "ERROR"})),
    ("grep ERROR app.log", ("search_files", {"root": "app.log", "pattern": "ERROR"})),
    ("grep -i error /var/log/syslog", ("search_files", {"root": "/var/log/syslog", "pattern": "error",
                                                         "ignore_case": True})),
    ('search for "connection refused" in /var/log/nginx',
     ("search_files", {"root": "/var/log/nginx", "pattern": "connection refused"})),
    ("find timeout in app.log ignore case", ("search_files", {"root": "app.log", "pattern": "timeout",
                                                              "ignore_case": True})),
    ("在 app.log 中搜索 ERROR", ("search_files", {"root": "app.log", "pattern": "ERROR"})),
    ("在 /var/log 里查找 error", ("search_files", {"root": "/var/log", "pattern": "error"})),
    ("搜索 app.log 中的 ERROR", ("search_files", {"root": "app.log", "pattern": "ERROR"})),
    ("app.log 里有没有 ERROR", ("search_files", {"root": "app.log", "pattern": "ERROR"})),
    ("列出 nginx 目录下的文件", ("list_dir", {"path": "nginx"})),
    ("list files in nginx", ("list_dir", {"path": "nginx"})),
    ("ls nginx", ("list_dir", {"path": "nginx"})),
    ("ls -la", ("list_dir", {"path": "."})),
    ("list files in the current directory", ("list_dir", {"path": "."})),
    ("查看 config.yaml 第2行", ("read_file", {"path": "config.yaml", "offset": 2, "lines": 1})),
    ("查看 config.yaml 第2到5行", ("read_file", {"path": "config.yaml", "offset": 2, "lines": 4})),
    ("show me lines 10-20 of app.py", ("read_file", {"path": "app.py", "offset": 10, "lines": 11})),
    ("查看 /var/log/app.log 第 100 行", ("read_file", {"path": "/var/log/app.log", "offset": 100, "lines": 1})),
])
def test_file_requests_are_recognized(text, expected):
    assert [(i.tool, i.arguments) for i in parse(text)] == [expected]


@pytest.mark.parametrize("text", ["查看 /var/log/dpkg.log 最后 20 行日志", "tail /var/log/syslog", "show disk usage",
                                  "is localhost:8080 open?", "检查 127.0.0.1:9999 端口"])
def test_other_requests_keep_their_tools(text):
    assert all(i.tool not in ("list_dir", "read_file", "search_files") for i in parse(text))


def test_long_hostile_texts_parse_quickly():
    for text in ("/a" * 5000 + "!", "grep " + "a " * 5000 + "in /x", "在" + "/a" * 240 + "里搜", "列出" + "x" * 30000):
        start = time.monotonic()
        parse(text)
        assert time.monotonic() - start < 1.0


@pytest.fixture
def agent(tmp_path) -> OfflineAgent:
    (tmp_path / "nginx").mkdir()
    (tmp_path / "nginx" / "access.log").write_text("GET / 200\nGET /x 500 ERROR upstream\n")
    (tmp_path / "config.yaml").write_text("port: 8080\npassword: hunter2hunter2\n")
    (tmp_path / ".env").write_text("KEY=1\n")
    return OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)])))


async def ask(agent, text):
    sink = RecordingSink()
    result = await agent.run_turn(make_request(text, model="offline"), sink)
    assert sink.text == result.content
    return result.content, sink, result


async def test_offline_answers_from_the_file_tools(agent, tmp_path):
    answer, sink, result = await ask(agent, f"列出 {tmp_path} 目录下的文件")
    assert [c.tool_name for c in result.tool_calls] == ["list_dir"] and "tool_call" in sink.kinds
    assert "config.yaml" in answer and "nginx/" in answer and ".env" not in answer and "已隐藏 1 个" in answer
    answer, _, _ = await ask(agent, "查看 config.yaml 的内容")
    assert "port: 8080" in answer and "hunter2hunter2" not in answer and "[REDACTED]" in answer
    answer, _, _ = await ask(agent, "grep ERROR in nginx")
    assert "access.log:2: GET /x 500 ERROR upstream" in answer and answer.startswith("1 line(s) matching 'ERROR'")
    answer, _, result = await ask(agent, "列出 nginx 目录下的文件")
    assert result.tool_calls[0].arguments["path"] == "nginx" and "access.log" in answer
    answer, _, _ = await ask(agent, "查看 config.yaml 第2行")
    assert "password:" in answer and "port: 8080" not in answer
    answer, _, _ = await ask(agent, "在 nginx 中搜索 ERROR")
    assert answer.startswith("在 ") and "access.log:2:" in answer


async def test_refusals_are_answered_and_the_turn_goes_on(agent):
    answer, _, result = await ask(agent, "cat /proc/self/environ")
    assert result.tool_calls[0].status == "error" and "pseudo filesystem" in answer
    assert result.finish_reason == "stop"
    answer, _, _ = await ask(agent, "查看 .env 的内容")
    assert "读取文件失败" in answer and "密钥" in answer and "KEY=1" not in answer


async def test_cut_reads_and_searches_are_explained_in_the_question_language(tmp_path):
    (tmp_path / "big.log").write_text("".join(f"line {i:05} ERROR {'x' * 60}\n" for i in range(2000)))
    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)], max_file_bytes=4096,
                                                                 max_search_bytes=4096)))
    answer, _, _ = await ask(agent, "查看 big.log 的内容")
    assert "只读取了文件的前 4.0 KiB" in answer and "only the first" not in answer
    answer, _, _ = await ask(agent, "show me the contents of big.log")
    assert "(Only the first 4.0 KiB of the file are read (tools.max_file_bytes)" in answer
    answer, _, _ = await ask(agent, "在 big.log 中搜索 ERROR")
    assert answer.endswith("（搜索提前结束：已达到匹配条数上限。）")
    answer, _, _ = await ask(agent, "grep ERROR in big.log")
    assert answer.endswith("(Search stopped early: the match limit was reached.)")


@pytest.mark.parametrize("text,expected", [
    ("查看 /data/日志/app.log 的内容", ("read_file", {"path": "/data/日志/app.log"})),
    ("show me /home/张三/notes.md", ("read_file", {"path": "/home/张三/notes.md"})),
    ("cat “/srv/报表/2026 年.csv”", ("read_file", {"path": "/srv/报表/2026 年.csv"})),
    ("看看 报告.txt", ("read_file", {"path": "报告.txt"})),
    ("列出 /srv/数据 目录下的文件", ("list_dir", {"path": "/srv/数据"})),
    ("ls 数据/", ("list_dir", {"path": "数据/"})),
    ("列出/tmp目录下的文件", ("list_dir", {"path": "/tmp"})),      # unspaced: ASCII only, as before
])
def test_paths_with_other_characters_when_quoted_or_spaced(text, expected):
    assert parse_file_request(text) == expected


async def test_a_chinese_file_name_is_read(tmp_path):
    (tmp_path / "日志").mkdir()
    (tmp_path / "日志" / "应用.log").write_text("启动完成\n")
    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)])))
    answer, _, result = await ask(agent, f"查看 {tmp_path}/日志/应用.log 的内容")
    assert [c.tool_name for c in result.tool_calls] == ["read_file"] and "启动完成" in answer

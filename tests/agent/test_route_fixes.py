"""Offline agent fixes: Chinese process and log requests, Chinese tool errors, the knowledge route's
routing words and follow-ups, and history-search answers kept out of later searches.

The parsing and the answers are checked on the agent itself; the knowledge route, the memory answer
it must not hide, and the history search run through a real server over loopback TCP.
"""
from __future__ import annotations

import re

import pytest

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from server.agent import knowledge_route
from server.agent.config import AgentConfig
from server.agent.intents import parse
from server.agent.offline import OfflineAgent
from server.tools import ToolRegistry, ToolsConfig
from testkit.server import poll

from .conftest import RecordingSink, make_request

ASCII_WORD = re.compile(r"[A-Za-z]{3,}")


# -- 1. Chinese process questions: no bogus name filter, RAM sorts by memory ------------------------
@pytest.mark.parametrize("text, expected", [
    ("CPU占用最高的进程", {"sort_by": "cpu"}),
    ("CPU占用最高的5个进程", {"sort_by": "cpu", "limit": 5}),
    ("CPU使用率最高的进程是哪个", {"sort_by": "cpu"}),
    ("RAM占用最多的进程", {"sort_by": "memory"}),
    ("CPU占用最高的5个python进程", {"sort_by": "cpu", "limit": 5, "name": "python"}),
    ("查看nginx进程", {"sort_by": "cpu", "name": "nginx"}),
])
def test_chinese_process_questions(text, expected):
    assert [(i.tool, i.arguments) for i in parse(text)] == [("processes", expected)]


@pytest.mark.parametrize("text, expected", [      # English words right next to Chinese ones
    ("RAM还剩多少", [("sys_monitor", {"metric": "memory"})]),
    ("swap使用情况", [("sys_monitor", {"metric": "memory"})]),
    ("uptime是多少", [("sys_monitor", {"metric": "uptime"})]),
    ("检查127.0.0.1:9999端口", [("network_check", {"host": "127.0.0.1", "port": 9999})]),
    ("检查端口22是否开放", [("network_check", {"host": "localhost", "port": 22})]),
    ("检查localhost的22端口", [("network_check", {"host": "localhost", "port": 22})]),
    ("查看/var/log/syslog日志", [("read_log", {"path": "/var/log/syslog"})]),
])
def test_english_words_next_to_chinese(text, expected):
    assert [(i.tool, i.arguments) for i in parse(text)] == expected


# -- 2. log paths relative to a log root; tool errors in the question's language --------------------
@pytest.mark.parametrize("text, expected", [
    ("tail nginx/error.log", {"path": "nginx/error.log"}),
    ("查看 nginx/error.log 最后 2 行日志", {"path": "nginx/error.log", "lines": 2}),
])
def test_relative_log_paths(text, expected):
    assert [(i.tool, i.arguments) for i in parse(text)] == [("read_log", expected)]


@pytest.fixture
def agent(tmp_path) -> OfflineAgent:
    (tmp_path / "nginx").mkdir()
    (tmp_path / "nginx" / "error.log").write_text("a\nb\nupstream timed out\n")
    return OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(cpu_sample_s=0.05, log_roots=[str(tmp_path)])))


async def ask(agent: OfflineAgent, text: str):
    return await agent.run_turn(make_request(text, model="offline"), RecordingSink())


async def test_a_log_under_a_root_is_read_by_its_relative_path(agent, tmp_path):
    result = await ask(agent, "tail nginx/error.log")
    assert result.tool_calls[0].status == "success" and result.content.endswith("upstream timed out\n```")
    result = await ask(agent, "查看 nginx/error.log 最后 2 行日志")
    assert result.content.startswith(f"{tmp_path}/nginx/error.log 的最后 2 行") and "\nb\nupstream timed out\n" in result.content


@pytest.mark.parametrize("text, expected", [
    ("查看 nginx/missing.log 最后 2 行日志", "读取日志失败：找不到日志文件：“nginx/missing.log”。"
     "\n（相对路径在服务器的每个日志目录（[tools] log_roots）下查找；请给出日志文件的路径，例如 nginx/error.log，或绝对路径。）"),
    ("查看 /etc/passwd 最后 2 行日志", "读取日志失败：路径“/etc/passwd”不在允许的日志目录内。"),
    ("检查 example.com:443 端口", "检查端口失败：不允许连接主机“example.com”：network_check 只能连接"
                              "服务器 tools.allowed_hosts 中列出的主机（默认仅本机）。"),
])
async def test_a_chinese_question_gets_its_tool_error_in_chinese(agent, text, expected):
    result = await ask(agent, text)
    assert result.tool_calls[0].status == "error" and result.content == expected


async def test_an_english_question_keeps_the_tools_own_error(agent):
    result = await ask(agent, "tail nginx/missing.log")
    assert result.content.startswith("The read_log tool could not answer: no such log file: 'nginx/missing.log'\n"
                                     "(A relative path is looked for under each log directory")


async def test_an_unknown_tool_error_is_marked_as_the_original_in_chinese():
    bare = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig()))     # no log roots at all
    result = await ask(bare, "查看 app.log 最后 2 行日志")
    assert result.content == "读取日志失败：read_log 未启用：服务器没有配置日志目录（tools.log_roots）。"
    from server.agent.answers import error_zh
    assert error_zh("something new went wrong") == "原始错误信息：something new went wrong"


# -- 3. the words that route to the documents are not searched ---------------------------------------
@pytest.mark.parametrize("text, query, terms", [
    ("Does the documentation say which port the payments gateway listens on?",
     "which port the payments gateway listens on?", {"port", "payment", "gatewai", "listen"}),
    ("According to my documents, what is the RTO for the search service?",
     ", what is the RTO for the search service?", {"rto", "search", "servic"}),
    ("Search my documents for the escalation contact", "the escalation contact", {"escal", "contact"}),
    ("what do the docs say about the system override?", "the system override?", {"system", "overrid"}),
    ("文档里有没有写订单系统的缓存用什么？", "订单系统的缓存用什么？", {"订单", "单系", "系统", "缓存", "存用"}),
    ("知识库里 log retention 是多少天？", "log retention 是多少天？", {"log", "retent", "多少", "少天"}),
    ("search my documents", "", set()),
])
def test_routing_words_are_left_out_of_the_search(text, query, terms):
    assert knowledge_route.KEYWORDS.search(text)
    assert knowledge_route.search_query(text) == query and knowledge_route.search_terms(text) == terms


DOCS = {
    "gateway.md": b"# Gateway reference\n\nThis page documents every setting of the edge gateway.\n\n"
                  b"## Timeouts\n\nThe upstream timeout defaults to 15 seconds.\n",
    "网关说明.md": "# 网关说明\n\n本文档介绍边缘网关的全部配置项。\n\n## 超时\n\n上游超时默认是十五秒。\n".encode(),
    "runbook.md": b"# Payments runbook\n\n## Backup\n\n### Nightly\n\nNightly backups run at 02:30 UTC and are kept "
                  b"for 14 days.\n\n### Weekly\n\nA full backup runs every Sunday and is kept for 90 days.\n",
}


async def test_a_question_the_documents_do_not_answer_quotes_nothing(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for name, data in DOCS.items():
            await raw_upload(c, name, data)
        end, _ = await chat(c, "According to my documents, who supplies the coffee machine?")
        assert end["context"]["route"]["method"] == "keyword" and "document" not in end["context"]["route"]["query"]
        assert end["message"]["content"] == "I found nothing about that in your documents."
        assert "citations" not in end["message"]["metadata"]
        end, _ = await chat(c, "文档里有没有写网球场的开放时间？")   # 网, 时: single characters of its passages
        assert end["message"]["content"] == "知识库里没有找到相关内容。"
        assert "citations" not in end["message"]["metadata"]
        end, _ = await chat(c, "Does the documentation say what the upstream timeout defaults to?")
        content = end["message"]["content"]
        assert "> The upstream timeout defaults to 15 seconds." in content and "This page documents" not in content
        assert [x["name"] for x in end["message"]["metadata"]["citations"]] == ["gateway.md"]
        await c.close()


# -- 4. a follow-up to the documents must refer back or share their terms -----------------------------
@pytest.mark.parametrize("text, refers", [
    ("and its port?", True), ("那它的端口呢", True), ("tell me more", True), ("what about the weekly one?", True),
    ("What is the staging server?", False), ("谢谢", False), ("thanks!", False), ("好的，谢谢", False),
    ("thanks, that helps", False),
])
def test_what_refers_back(text, refers):
    previous = "From your documents:\n\n> Nightly backups are kept for 14 days.\n\n— [runbook.md §Backup, line 3]"
    assert knowledge_route._refers_to(text, previous) is refers


async def test_a_short_message_after_a_documents_answer_is_not_always_a_follow_up(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", DOCS["runbook.md"])
        end, _ = await chat(c, "Remember that the staging server is stage-9.")
        assert end["message"]["content"] == "Noted:\n- The staging server is stage-9."

        async def learned() -> bool:
            items = (await c.call(MsgType.MEMORY_LIST))["items"]
            return any("stage-9" in i["text"] for i in items)
        await poll(learned, timeout=30)
        await c.call(MsgType.SESSION_NEW)
        backups = "How long are nightly backups kept?"

        async def from_documents() -> None:
            end, _ = await chat(c, backups)
            assert end["message"]["content"].startswith("From your documents:")
        await from_documents()
        end, _ = await chat(c, "What is the staging server?")      # what it is when asked alone: memory
        assert end["context"]["route"]["method"] != "follow_up"
        assert end["message"]["content"].startswith("From what you told me earlier:\n- The staging server is stage-9.")
        await from_documents()
        end, _ = await chat(c, "and what is the staging server?")  # refers back, but the memory answers it
        assert end["context"]["route"]["method"] != "follow_up" and "stage-9" in end["message"]["content"]
        await from_documents()
        end, _ = await chat(c, "谢谢")
        assert end["context"]["route"]["method"] != "follow_up" and "知识库" not in end["message"]["content"]
        assert end["message"]["content"].startswith("不客气") and end["message"]["metadata"]["canned"] is True
        end, _ = await chat(c, "thanks, got it!")
        assert end["message"]["content"].startswith("You're welcome")
        await from_documents()
        end, _ = await chat(c, "and the weekly one?")                 # a real follow-up still is one
        assert end["context"]["route"]["method"] == "follow_up"
        assert "> A full backup runs every Sunday and is kept for 90 days." in end["message"]["content"]
        assert "Nightly backups" not in end["message"]["content"]
        end, _ = await chat(c, "and its owner?")                     # none of its words in any passage
        assert end["context"]["route"]["method"] == "follow_up"
        assert end["message"]["content"] == "I found nothing about that in your documents."
        await c.close()


# -- 5. history-search answers are not found by the next history search ------------------------------
async def test_asking_the_same_history_question_again_finds_what_was_said(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await chat(c, "Remember that the staging server is stage-7.")
        question = "what did I say about the staging server before?"
        for _ in range(6):
            await c.call(MsgType.SESSION_NEW)
            end, _ = await chat(c, question)
            assert end["message"]["metadata"]["history_listing"] is True
        content = end["message"]["content"]
        assert content.startswith("Found 1 earlier message(s) about 'staging server':")
        assert "Remember that the staging server is stage-7." in content and content.count(question) == 0
        hits = await srv.services.memory.search("alice", "staging server")
        assert [h["snippet"] for h in hits] == ["Remember that the staging server is stage-7. / Noted: - The staging "
                                                "server is stage-7."]
        end, _ = await chat(c, "CPU usage")
        assert "history_listing" not in end["message"]["metadata"]
        await c.close()

"""Session 33, the offline agent's Chinese (and English) intents and wording: history questions with
no topic or a day, file and log phrasings, Chinese numerals, requests to act, language preferences,
the help text, tables, bad input and the answers' wording. Tool results come from the real tools
(registry.run / OfflineAgent.run_turn); the history questions run through a real server over loopback."""
from __future__ import annotations

import socket
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from kb_wire.kbwire import chat, connect, wired_server
from protocol import MsgType
from server.agent import answers
from server.agent.config import AgentConfig
from server.agent.file_intents import arabic_numbers, zh_number
from server.agent.intents import RECENT_QUERY, is_chinese, parse
from server.agent.offline import OfflineAgent
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from storage.models import ToolCall

from .conftest import RecordingSink, make_request

CTX = ToolContext("alice", "s_now")


def calls(text: str) -> list[tuple[str | None, dict]]:
    return [(i.tool, i.arguments) for i in parse(text)]


def names(text: str) -> list[str]:
    return [i.name for i in parse(text)]


def result(tool: str, value: dict, status: str = "success") -> ToolCall:
    return ToolCall(id="call_1", tool_name=tool, result=orjson.dumps(value).decode(), status=status)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "logs" / "nginx").mkdir(parents=True)
    (tmp_path / "logs" / "nginx" / "error.log").write_text("a\nupstream timed out\n")
    (tmp_path / "logs" / "nginx" / "access.log").write_text("GET / 200\nGET /x 502\nGET /y 502\n")
    (tmp_path / "logs" / "app.log").write_text("".join(f"line {i} INFO\n" for i in range(1, 61)))
    return tmp_path


@pytest.fixture
def agent(tree) -> OfflineAgent:
    return OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(cpu_sample_s=0.05, log_roots=[str(tree / "logs")],
                                                                file_roots=[str(tree)])))


async def ask(agent: OfflineAgent, text: str):
    return await agent.run_turn(make_request(text, model="offline"), RecordingSink())


# -- 2. history questions: no topic, a day ----------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("我们之前聊过什么", {"query": RECENT_QUERY, "limit": 10}),              # (was: a search for "什")
    ("我刚才问了什么", {"query": RECENT_QUERY, "limit": 10, "current_session_only": True}),   # (was: not understood)
    ("三天前问过什么", {"query": "三天前", "limit": 10}),
    ("昨天我问过 redis 的什么问题", {"query": "redis 昨天", "limit": 10}),     # (was: "redis", any day)
    ("前天我问过 nginx 什么", {"query": "nginx 前天", "limit": 10}),
    ("上周二我问过 CPU 的什么", {"query": "CPU 上周二", "limit": 10}),
    ("what did I ask about redis yesterday", {"query": "redis yesterday", "limit": 10}),
    ("what did I ask about redis 3 days ago?", {"query": "redis 3 days ago", "limit": 10}),
    ("what did we talk about yesterday?", {"query": "yesterday", "limit": 10}),
    ("what did we talk about?", {"query": RECENT_QUERY, "limit": 10}),
    ("what did I ask about nginx earlier", {"query": "nginx"}),               # (unchanged)
    ("我之前问过nginx什么", {"query": "nginx"}),
])
def test_history_questions_name_their_topic_and_day_apart(text, expected):
    assert calls(text) == [("history_search", expected)]


def test_what_did_i_ask_about_it_is_still_not_a_search():
    assert parse("what did I ask about it") == []


def _hit(text: str, when: datetime, sid: str = "s_1") -> dict:
    return {"session_id": sid, "title": "t", "message_id": 2, "role": "user", "time": when.isoformat(), "snippet": text}


def test_a_day_asked_keeps_the_answer_to_that_day_and_says_when_nothing_falls_on_it():
    now = datetime.now(timezone.utc)
    yesterday, today = now - timedelta(days=1), now
    hits = [_hit("redis 连接超时怎么办", today), _hit("redis 端口是多少", yesterday), _hit("CPU 怎么样", yesterday)]
    said = answers.render(result("history_search", {"query": "redis 昨天", "hits": hits}), zh=True)
    assert said.startswith("昨天找到 1 条与“redis”相关的历史消息：") and "redis 端口是多少" in said
    assert "连接超时" not in said and "CPU" not in said
    said = answers.render(result("history_search", {"query": "redis 前天", "hits": hits}), zh=True)
    assert said.startswith("前天的对话中没有找到与“redis”相关的内容。\n其他日期提到“redis”的消息：")
    said = answers.render(result("history_search", {"query": "三天前", "hits": hits}), zh=True)
    assert said == "三天前没有找到之前的对话。"
    said = answers.render(result("history_search", {"query": "redis yesterday", "hits": hits}), zh=False)
    assert said.startswith("Found 1 message(s) about 'redis' yesterday:") and "CPU" not in said
    said = answers.render(result("history_search", {"query": RECENT_QUERY, "hits": hits}), zh=True)
    assert said.startswith("最近 7 天的对话（3 条，最新的在前）：")
    assert said.index("连接超时") < said.index("端口是多少")               # newest first


async def test_history_questions_without_a_topic_over_the_wire(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        end, _ = await chat(c, "记住 redis 的端口是 6380")
        assert end["message"]["metadata"]["intents"] == ["note"]
        end, _ = await chat(c, "我刚才问了什么")
        content = end["message"]["content"]
        assert content.startswith("最近 7 天的对话（1 条，最新的在前）：") and "记住 redis 的端口是 6380" in content
        await c.call(MsgType.SESSION_NEW)
        end, _ = await chat(c, "我们之前聊过什么")
        assert "记住 redis 的端口是 6380" in end["message"]["content"] and "“什”" not in end["message"]["content"]
        end, _ = await chat(c, "昨天我问过 redis 的什么问题")
        content = end["message"]["content"]
        assert content.startswith("昨天的对话中没有找到与“redis”相关的内容。\n其他日期提到“redis”的消息：")
        assert "记住 redis 的端口是 6380" in content
        end, _ = await chat(c, "三天前问过什么")
        assert end["message"]["content"] == "三天前没有找到之前的对话。"
        await c.close()


# -- 4. file and log phrasings -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("搜索 logs 目录下包含 timeout 的行", [("search_files", {"root": "logs", "pattern": "timeout"})]),
    ("app.log 里有没有 ERROR", [("search_files", {"root": "app.log", "pattern": "ERROR"})]),
    ("access.log 里有几个 502", [("search_files", {"root": "access.log", "pattern": "502"})]),
    ("帮我看下 nginx 的 error log", [("read_log", {"path": "nginx/error.log"})]),
    ("看下 nginx 的错误日志", [("read_log", {"path": "nginx/error.log"})]),
    ("nginx 的访问日志", [("read_log", {"path": "nginx/access.log"})]),
    ("看下错误日志", [(None, {})]),                                         # which log: its path is asked
])
def test_file_and_log_phrasings(text, expected):
    assert calls(text) == expected


async def test_grep_under_a_folder_counts_and_named_logs_are_answered(agent, tree):
    r = await ask(agent, "搜索 logs 目录下包含 timed out 的行")
    assert r.tool_calls[0].tool_name == "search_files" and "error.log:2: upstream timed out" in r.content
    r = await ask(agent, "logs/nginx/access.log 里有几个 502")
    assert r.content.startswith(f"在 {tree}/logs/nginx/access.log 中找到 2 行匹配“502”：")
    r = await ask(agent, "看下 nginx 的错误日志")
    assert r.content.startswith(f"{tree}/logs/nginx/error.log 的最后 2 行")
    r = await ask(agent, "app.log 里有没有 ERROR")        # under a log root, not at a file root: found there too
    assert r.tool_calls[0].status == "success"
    assert r.content.startswith(f"在 {tree}/logs/app.log 中没有找到匹配“ERROR”的行")
    assert answers.without_tool(parse("看下错误日志"), zh=True).startswith("请告诉我是哪个日志文件")


# -- 5. Chinese numerals -----------------------------------------------------------------------------------
def test_chinese_numerals_are_counts():
    assert [zh_number(t) for t in ("二十", "三十五", "一百", "十二", "两百", "一百零五", "一二")] == [20, 35, 100, 12, 200,
                                                                                                  105, None]
    assert arabic_numbers("看一下 有没有一个python进程 统一") == "看一下 有没有一个python进程 统一"
    assert calls("内存占用前三的进程") == [("processes", {"sort_by": "memory", "limit": 3})]
    assert calls("CPU占用前五的进程") == [("processes", {"sort_by": "cpu", "limit": 5})]
    assert calls("两个占用内存最多的进程") == [("processes", {"sort_by": "memory", "limit": 2})]
    assert calls("查看 app.log 最后二十行") == [("read_log", {"path": "app.log", "lines": 20})]
    assert calls("查看 config.yaml 第二到第五行") == [("read_file", {"path": "config.yaml", "offset": 2, "lines": 4})]


async def test_twenty_lines_are_twenty(agent):
    r = await ask(agent, "查看 app.log 最后二十行")
    assert "的最后 20 行" in r.content and "line 41 INFO" in r.content and "line 40 INFO" not in r.content


# -- 6. requests to act ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["帮我把 pid 5708 的进程杀掉", "删除 logs/nginx/access.log", "重启一下 nginx",
                                  "执行 rm -rf /tmp/x", "kill 5708", "please restart nginx", "停止 nginx 服务",
                                  "can you delete app.log?", "rm -rf /tmp/x", "关闭防火墙"])
def test_requests_to_act_are_refused(text):
    assert names(text) == ["refuse"]
    assert answers.without_tool(parse(text), is_chinese(text)) == answers.refusal(is_chinese(text))


@pytest.mark.parametrize("text", ["why did nginx stop?", "停止的进程有哪些", "show stopped containers",
                                  "run time of the backup", "nginx 重启过吗", "上次重启是什么时候", "备份任务什么时候执行",
                                  "查看进程", "nginx 怎么重启"])
def test_questions_about_acting_are_not_refused(text):
    assert "refuse" not in names(text)


async def test_the_agent_refuses_to_act_and_notes_what_it_does_not_measure(agent):
    """Through the agent: a request to act runs no tool and is answered the refusal (before: a process
    listing for "杀掉", read_log for "删除"); "磁盘 IO 高不高" says IO is not measured, then gives space."""
    for text in ("帮我把 pid 5708 的进程杀掉", "删除 logs/nginx/access.log", "please restart nginx"):
        result = await ask(agent, text)
        assert result.content == answers.refusal(is_chinese(text)), text
        assert not result.tool_calls, text
    result = await ask(agent, "磁盘 IO 高不高")
    assert "离线工具不测量磁盘 IO" in result.content
    assert len(result.tool_calls) == 1 and "磁盘" in result.content          # the space it does measure


def test_the_refusal_says_the_tools_are_read_only_in_the_question_language():
    assert answers.refusal(True).startswith("无法执行这个操作：离线助手的工具都是只读的")
    assert answers.refusal(False).startswith("I can't do that: the offline assistant's tools are read-only")


# -- 7. a language preference the offline agent cannot follow ----------------------------------------------
async def test_an_answer_language_preference_is_acknowledged_with_what_the_offline_agent_does(agent):
    r = await ask(agent, "以后用英文回答")
    assert r.content.endswith("- 以后用英文回答\n（离线助手按提问的语言回答；配置大语言模型后会按这个偏好回答。）")
    assert answers.noted([("preference", "Always answer in Chinese")], zh=False).endswith(
        "(The offline assistant answers in the language of the question; a configured language model follows "
        "this preference.)")
    assert answers.noted([("preference", "以后用中文回答。")], zh=True) == "好的，记下了：\n- 以后用中文回答。"


# -- 8. the help text lists every capability with its condition ---------------------------------------------
def test_the_help_text_lists_files_documents_memory_and_downloads():
    zh, en = answers.help_text(True), answers.help_text(False)
    for part in ("[tools] file_roots", "[tools] log_roots", "nplt-client kb upload", "下载", "记住", "忘掉", "只读"):
        assert part in zh, part
    for part in ("[tools] file_roots", "nplt-client kb upload", "download <name>", "remember that", "forget",
                 "read"):
        assert part in en, part
    assert "nginx" not in zh + en                 # no searchable subject in a canned text


# -- 9. tables and bad input -------------------------------------------------------------------------------
def test_tables_and_bad_input():
    assert calls("带宽占用多少") == [("sys_monitor", {"metric": "network"})]
    assert calls("网关的健康检查间隔是多少") == []                          # 健康检查 is no overview
    assert calls("系统健康吗") == [("sys_monitor", {"metric": "all"})]
    [disk] = parse("磁盘 IO 高不高")
    assert (disk.tool, disk.arguments, disk.note) == ("sys_monitor", {"metric": "disk"}, "io_not_measured")
    assert answers.with_notes("磁盘使用情况：…", [disk], zh=True) == "离线工具不测量磁盘 IO（读写速度、IOPS），以下是磁盘空间：\n磁盘使用情况：…"
    assert calls("检查 localhost:70000 端口") == [("network_check", {"host": "localhost", "port": 70000})]
    assert calls("127.0.0.1:99999") == [("network_check", {"host": "127.0.0.1", "port": 99999})]
    assert is_chinese("？") and is_chinese("。。。") and not is_chinese("CPU？")
    for text in ("？", "嗯", "你是谁", "早上好", "在吗", "good morning", "who are you?"):
        assert names(text) == ["help"], text


async def test_a_port_out_of_range_is_said(agent):
    r = await ask(agent, "检查 localhost:70000 端口")
    assert r.content == "端口必须在 1–65535 之间（收到的是 70000）。"
    r = await ask(agent, "check port 99999 on 127.0.0.1")
    assert r.content == "The port must be between 1 and 65535 (got 99999)."


async def test_greetings_and_fillers_get_the_help_text(agent):
    for text in ("嗯", "你是谁", "？"):
        r = await ask(agent, text)
        roots = (agent.registry.config.log_roots, agent.registry.config.file_roots)    # (the help names them)
        assert r.content == answers.help_text(True, roots), text


# -- 10. wording -------------------------------------------------------------------------------------------
async def test_a_tool_failure_says_what_failed_in_words(agent):
    r = await ask(agent, "查看 missing.yaml 的内容")
    assert r.content.startswith("读取文件失败：找不到文件：“missing.yaml”（查找了：") and "read_file" not in r.content


async def test_network_table_wording(agent):
    r = await ask(agent, "带宽占用多少")
    assert "（入站/出站错误 " in r.content and "，丢包 " in r.content and "入/出" not in r.content
    assert "- lo（启用）：127.0.0.1" in r.content and "(启用)" not in r.content


def test_the_clock_says_utc_once_in_a_utc_zone():
    value = {"local": "2026-11-27T19:22:12+00:00", "utc": "2026-11-27T19:22:12+00:00", "timezone": "UTC",
             "utc_offset": "+00:00", "weekday": "Friday", "unix": 0}
    assert answers.render(result("clock", value), zh=True) == "现在是 2026-11-27 19:22:12 UTC（星期五）。"
    value.update(local="2026-11-28T03:22:12+08:00", timezone="CST", utc_offset="+08:00", weekday="Saturday")
    assert answers.render(result("clock", value), zh=True) == \
        "现在是 2026-11-28 03:22:12（CST，UTC+08:00，星期六），UTC 时间 19:22:12。"


async def test_process_heading_wording(agent):
    r = await ask(agent, "CPU占用前五的进程")
    assert r.content.startswith("按 CPU 排序的前 5 个进程（共 ") and "匹配" not in r.content.split("\n")[0]
    r = await ask(agent, "python 进程")
    assert r.content.split("\n")[0].endswith("个）：") and "匹配" in r.content.split("\n")[0]


def test_disk_and_load_get_a_verdict():
    fs = {"mount": "/", "fstype": "ext4", "device": "/dev/vda", "used": "95 GiB", "total": "100 GiB", "free": "5 GiB"}
    full = {"metric": "disk", "disk": {"filesystems": [dict(fs, percent=95.0), dict(fs, mount="/data", percent=40.0)]}}
    assert answers.render(result("sys_monitor", full), zh=True).endswith("\n快满了：/（95.0%）。")
    assert answers.render(result("sys_monitor", full), zh=False).endswith("\nNearly full: / (95.0%).")
    ok = {"metric": "disk", "disk": {"filesystems": [dict(fs, percent=40.0)]}}
    assert answers.render(result("sys_monitor", ok), zh=True).endswith("\n没有快满的文件系统（最满的 / 已用 40.0%）。")
    load = {"metric": "load", "load": {"load_1m": 6.0, "load_5m": 5.0, "load_15m": 4.0, "cores_logical": 4}}
    assert answers.render(result("sys_monitor", load), zh=True).endswith("偏高：每核 1.5（1 分钟）。")
    load["load"]["load_1m"] = 1.0
    assert answers.render(result("sys_monitor", load), zh=False).endswith(" Normal: 0.25 per core (1 min).")


async def test_a_real_port_error_is_said_in_words(tree):
    registry = ToolRegistry(ToolsConfig())
    call = await registry.run("network_check", {"host": "localhost", "port": 0}, CTX)
    assert answers.render(call, zh=True) == "端口必须在 1–65535 之间（收到的是 0）。"
    with socket.socket() as s:                    # a port in range but closed: the connect result, not the range
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    call = await registry.run("network_check", {"host": "127.0.0.1", "port": port}, CTX)
    assert "1–65535" not in answers.render(call, zh=True)

"""Session 33, regressions of the day's offline-agent fixes (fixer "offline3"), each over a real server
too (loopback) where the wire matters:

2. the "refuse" rule (``act_requests.is_request_to_act``) refused read-only questions: "运行中的进程有哪些" (a
   process listing before), "运行最久的进程是哪个", "你运行在哪台机器上", "启动项有哪些", "停止运行的服务有哪些",
   "Format the answer as a table: top processes by memory", "run queue length?", "Stop, show me the CPU
   usage instead". Now only an imperative aimed at something is refused, and never a question;
3. ``parse`` wrote every Chinese numeral of the message in digits, so "查看 /data/第三季度/report.log 的内容"
   read "/data/第3季度/report.log" and a grep for "第三次" looked for "第3次". Now only the counts being
   parsed are read in digits;
4. the offline memory answers skipped a window message of more than 8 sentences, which the memory layer
   learns from: "We moved racks today. ... The staging server is stage-7.internal. ... We left at six."
   then "what is the staging server?" got "cannot handle" in the same session (a new session answered
   it from memory). Now such a message counts with its first MAX_ITEMS_PER_MESSAGE statements, as the
   memory layer learns them; the statement itself is no clock request.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import pytest

from kb_wire.kbwire import chat, connect, wired_server
from protocol import MsgType
from server.agent import answers, memory_answers
from server.agent.file_intents import arabic_numbers, parse_file_request
from server.agent.intents import is_chinese, parse
from server.memory.distill import MAX_ITEMS_PER_MESSAGE, distill_rules as real_distill_rules
from server.memory.extractive import sentences
from testkit.server import poll


def calls(text: str) -> list[tuple[str | None, dict]]:
    return [(i.tool, i.arguments) for i in parse(text)]


def names(text: str) -> list[str]:
    return [i.name for i in parse(text)]


# -- 2. the refuse rule: questions and requests about the answer are not refused ----------------------------
@pytest.mark.parametrize("text, expected", [
    ("运行中的进程有哪些", [("processes", {"sort_by": "cpu"})]),         # a process listing before today
    ("运行最久的进程是哪个", [("processes", {"sort_by": "cpu"})]),
    ("你运行在哪台机器上", []),
    ("启动项有哪些", []),
    ("停止运行的服务有哪些", []),
    ("Format the answer as a table: top processes by memory", [("processes", {"sort_by": "memory"})]),
    ("run queue length?", []),
    ("Stop, show me the CPU usage instead", [("sys_monitor", {"metric": "cpu"})]),   # a request for the CPU
    ("运行中的进程", [("processes", {"sort_by": "cpu"})]),
    ("停止运行的服务", []),
    ("start over", []),
    ("stop talking", []),
    ("Start the answer with a summary", []),
    ("edit your reply", []),
    ("change the language to English", []),
    ("restart count of nginx", []),
    ("安装目录", []),
    ("运行环境", []),
    ("启动失败的服务", []),
    ("结束这个话题", []),
    ("格式化输出", []),
    ("kill the process which uses the most memory?", [("processes", {"sort_by": "memory"})]),
])
def test_questions_and_requests_about_the_answer_are_not_refused(text, expected):
    assert "refuse" not in names(text)
    assert calls(text) == expected


@pytest.mark.parametrize("text", [
    # (the cases of test_s33_zh_intents.py::test_requests_to_act_are_refused, and more of the kind)
    "帮我把 pid 5708 的进程杀掉", "删除 logs/nginx/access.log", "重启一下 nginx", "执行 rm -rf /tmp/x", "kill 5708",
    "please restart nginx", "停止 nginx 服务", "can you delete app.log?", "rm -rf /tmp/x", "关闭防火墙",
    "可以帮我重启 nginx 吗", "能不能关闭防火墙？", "删除所有临时文件", "nginx 挂了，帮我重启 nginx", "帮我杀掉占用 CPU 最多的进程",
    "停止运行 nginx", "清理一下缓存", "关机", "把所有 python 进程杀掉", "restart the web server", "delete all old log files",
    "format the disk", "edit /etc/hosts", "kill nginx", "sudo reboot", "reboot", "systemctl restart nginx",
    "could you stop postgres?", "删除目录 /tmp/x", "删除用户 bob", "执行脚本 backup.sh",
])
def test_an_imperative_aimed_at_something_is_refused(text):
    assert names(text) == ["refuse"]
    assert answers.without_tool(parse(text), is_chinese(text)) == answers.refusal(is_chinese(text))


async def test_over_tcp_a_question_about_running_processes_is_answered_and_a_request_to_act_refused(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        end, _ = await chat(c, "运行中的进程有哪些")
        msg = end["message"]
        assert [t["tool_name"] for t in msg["tool_calls"]] == ["processes"]
        assert msg["content"].startswith("按 CPU 排序的前") and msg["content"] != answers.refusal(True)
        end, _ = await chat(c, "Stop, show me the CPU usage instead")
        assert [t["tool_name"] for t in end["message"]["tool_calls"]] == ["sys_monitor"]
        assert "CPU" in end["message"]["content"]
        end, _ = await chat(c, "please restart nginx")
        assert end["message"]["content"] == answers.refusal(False) and not end["message"]["tool_calls"]
        await c.close()


# -- 3. numerals: counts only, never a path, a quoted string or a grep pattern --------------------------------
def test_numerals_are_written_in_digits_only_where_a_count_is_read():
    assert calls("查看 /data/第三季度/report.log 的内容") == [("read_file", {"path": "/data/第三季度/report.log"})]
    assert calls("查看 /data/第三季度/report.log 第二到第五行") == \
        [("read_file", {"path": "/data/第三季度/report.log", "offset": 2, "lines": 4})]
    assert calls("查看 /data/第三季度/app.log 最后二十行") == [("read_log", {"path": "/data/第三季度/app.log", "lines": 20})]
    assert calls("在 app.log 中搜索 第三次") == [("search_files", {"root": "app.log", "pattern": "第三次"})]
    assert calls("grep 第五 in app.log") == [("search_files", {"root": "app.log", "pattern": "第五"})]
    assert calls("app.log 里有几个 第三方") == [("search_files", {"root": "app.log", "pattern": "第三方"})]
    assert parse_file_request("查看 “第三季度 报告.txt” 第二行") == \
        ("read_file", {"path": "第三季度 报告.txt", "offset": 2, "lines": 1})
    assert calls("列出 /data/第三季度 目录下的文件") == [("list_dir", {"path": "/data/第三季度"})]
    assert arabic_numbers("查看 /data/第三季度/report.log 第二行 “前三名”") == "查看 /data/第三季度/report.log 第2行 “前三名”"
    # the counts still are counts
    assert calls("内存占用前三的进程") == [("processes", {"sort_by": "memory", "limit": 3})]
    assert calls("两个占用内存最多的进程") == [("processes", {"sort_by": "memory", "limit": 2})]


async def test_over_tcp_a_path_and_a_pattern_with_numerals_are_read_as_said(tmp_path):
    data = tmp_path / "files"
    (data / "第三季度").mkdir(parents=True)
    (data / "第三季度" / "report.log").write_text("季度报告 OK\n", encoding="utf-8")
    (data / "notes.txt").write_text("第3次 重试\n第三次 重试失败\n", encoding="utf-8")
    async with wired_server(tmp_path, tools={"file_roots": [str(data)]}) as (srv, addr):
        c = await connect(addr, "alice")
        end, _ = await chat(c, f"查看 {data}/第三季度/report.log 的内容")
        msg = end["message"]
        assert [t["tool_name"] for t in msg["tool_calls"]] == ["read_file"]
        assert "季度报告 OK" in msg["content"] and "第3季度" not in msg["content"]
        end, _ = await chat(c, "在 notes.txt 中搜索 第三次")
        msg = end["message"]
        assert [t["tool_name"] for t in msg["tool_calls"]] == ["search_files"]
        assert "第三次 重试失败" in msg["content"] and "第3次 重试" not in msg["content"]
        await c.close()


# -- 4. a long message counts with its first statements, as the memory layer learns them ---------------------
RACKS = ("We moved racks today. The old switch was noisy. I replaced two cables. The team ate lunch late. Backups ran "
         "fine. The staging server is stage-7.internal. Nobody complained. The weather was bad. We left at six.")
HERE = " (earlier in this conversation)"


@pytest.fixture
def distilled(monkeypatch) -> dict[str, list[int]]:
    """An empty memo, and memory_answers' distill calls recorded: message text -> the threads that distilled it."""
    monkeypatch.setattr(memory_answers, "_memo", OrderedDict())
    monkeypatch.setattr(memory_answers, "_memo_chars", 0)
    seen: dict[str, list[int]] = {}

    def counting(text: str) -> list[tuple[str, str]]:
        seen.setdefault(text, []).append(threading.get_ident())
        return real_distill_rules(text)
    monkeypatch.setattr(memory_answers, "distill_rules", counting)
    return seen


def window(*said: str) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": "sys"}]
    for text in said[:-1]:
        out += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    return out + [{"role": "user", "content": said[-1]}]


def test_a_message_of_more_than_8_sentences_counts_with_its_first_statements(distilled):
    assert len(sentences(RACKS)) == 9 > MAX_ITEMS_PER_MESSAGE
    question = "what is the staging server?"
    assert memory_answers.answer(question, window(RACKS, question), zh=False).splitlines()[:2] == \
        ["From what you told me earlier:", f"- The staging server is stage-7.internal.{HERE}"]
    assert len(distilled[RACKS]) == 1
    # 12 statements: the first MAX_ITEMS_PER_MESSAGE (8) count, as the memory layer keeps them
    twelve = " ".join(f"The host of service k{i} is node-{i}.internal." for i in range(1, 13))
    assert memory_answers.stated(window(twelve, "ok")) == [text for _, text in real_distill_rules(twelve)]
    assert len(memory_answers.stated(window(twelve, "ok"))) == MAX_ITEMS_PER_MESSAGE
    k8, k9 = "what is the host of service k8?", "what is the host of service k9?"
    assert memory_answers.answer(k8, window(twelve, k8), False).splitlines()[1] == \
        f"- The host of service k8 is node-8.internal.{HERE}"
    assert "node-9.internal" not in memory_answers.answer(k9, window(twelve, k9), False)     # (siblings only)
    # over 4,000 characters: still skipped on the loop (the memory layer learns it in a worker thread)
    long = RACKS + " " + "We walked around the building and had coffee. " * 90
    assert len(long) > memory_answers.INLINE_DISTILL_CHARS
    assert memory_answers.answer(question, window(long, question), zh=False) is None and long not in distilled


async def test_over_tcp_a_long_statement_answers_in_this_session_and_the_next_and_reads_no_clock(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        alice = await connect(addr, "alice")
        told_in = alice.session_id
        end, _ = await chat(alice, RACKS)
        assert "clock" not in end["message"]["metadata"].get("intents", [])
        assert not end["message"]["tool_calls"]                 # (before 26f8d9b: "today" read the clock)
        end, _ = await chat(alice, "what is the staging server?")
        assert end["message"]["content"].splitlines()[:2] == \
            ["From what you told me earlier:", f"- The staging server is stage-7.internal.{HERE}"]
        assert end["message"]["metadata"]["intents"] == ["memory"]

        async def learned() -> bool:
            items = (await alice.call(MsgType.MEMORY_LIST))["items"]
            return any(i["text"] == "The staging server is stage-7.internal." for i in items)
        await poll(learned, timeout=30, what="the memory layer learned the staging server")
        await alice.call(MsgType.SESSION_NEW)
        end, _ = await chat(alice, "what is the staging server?")
        content = end["message"]["content"]
        assert content.startswith("From what you told me earlier:\n- The staging server is stage-7.internal.")
        assert f"(session {told_in}, " in content
        await alice.close()

"""The offline agent end to end: intents in both languages run real tools; answers carry real numbers."""
from __future__ import annotations

import asyncio
import re
import socket
from datetime import datetime, timezone

import psutil
import pytest

from server.agent.config import AgentConfig
from server.agent.offline import OfflineAgent
from server.tools import ToolRegistry, ToolsConfig
from server.tools.units import fmt_bytes

from .conftest import RecordingSink, make_request

_SIZE = re.compile(r"([\d.]+) (B|KiB|MiB|GiB|TiB)")
_FACTORS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def size_of(text: str) -> float:
    m = _SIZE.fullmatch(text.strip())
    assert m, text
    return float(m.group(1)) * _FACTORS[m.group(2)]


@pytest.fixture
def agent(tmp_path) -> OfflineAgent:
    async def remembered(user_id):        # long-term memory on (and empty)
        return []
    return OfflineAgent(AgentConfig(stream_chunk_chars=16), ToolRegistry(ToolsConfig(cpu_sample_s=0.05,
                                                                                      log_roots=[str(tmp_path)]),
                                                                          memory_items=remembered))


async def ask(agent: OfflineAgent, text: str) -> tuple[str, RecordingSink, object]:
    sink = RecordingSink()
    result = await agent.run_turn(make_request(text, model="offline"), sink)
    assert sink.text == result.content                          # what streamed is what is returned
    assert all(0 < len(d) <= 16 for d in sink.of("delta"))
    return result.content, sink, result


async def test_identity(agent):
    assert (agent.name, agent.offline, agent.models(), agent.default_model) == ("offline", True, ["offline"], "offline")
    assert await agent.complete([{"role": "user", "content": "summarize"}]) == ""


@pytest.mark.parametrize("text,marker", [("查看CPU使用率", "CPU 使用率："), ("CPU usage please", "CPU usage: ")])
async def test_cpu_in_both_languages(agent, text, marker):
    answer, sink, result = await ask(agent, text)
    m = re.search(re.escape(marker) + r"([\d.]+)%", answer)
    assert m and 0.0 <= float(m.group(1)) <= 100.0
    assert sink.kinds[:5] == ["status:thinking", "status:tool_call", "tool_call", "tool_result", "status:generating"]
    [call] = result.tool_calls
    assert (call.tool_name, call.arguments, call.status, call.step) == ("sys_monitor", {"metric": "cpu"}, "success", 0)
    assert sink.of("tool_call")[0].id == call.id and sink.of("tool_call")[0].status == "running"


async def test_memory_chinese_matches_psutil(agent):
    answer, _, _ = await ask(agent, "内存还剩多少")
    m = re.search(r"已用 (.+?) / 共 (.+?)（([\d.]+)%），可用 (.+?)。", answer)
    assert m, answer
    assert m.group(2) == fmt_bytes(psutil.virtual_memory().total)
    assert abs(size_of(m.group(4)) - psutil.virtual_memory().available) < 0.1 * psutil.virtual_memory().total


async def test_disk_english_lists_root(agent):
    answer, _, _ = await ask(agent, "show disk usage")
    root = psutil.disk_usage("/")
    assert "- / (" in answer and f"of {fmt_bytes(root.total)}" in answer


async def test_top_processes_by_memory_are_real_and_sorted(agent):
    answer, _, result = await ask(agent, "占用内存最多的进程")
    assert answer.startswith("按内存排序的前")
    rows = re.findall(r"\d+\. (.+?)（pid (\d+)，用户 .+?）：CPU ([\d.]+)%，内存 (.+?)（", answer)
    assert len(rows) >= 2
    rss = [size_of(r[3]) for r in rows]
    assert rss == sorted(rss, reverse=True)
    live = {p.pid for p in psutil.process_iter()}
    assert sum(int(r[1]) in live for r in rows) >= len(rows) - 1   # one may exit meanwhile
    assert result.tool_calls[0].arguments == {"sort_by": "memory", "limit": 10}


async def test_network_check_open_and_closed_ports(agent):
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        answer, _, _ = await ask(agent, f"检查 127.0.0.1:{port} 端口")
        assert f"127.0.0.1:{port} 可以连通" in answer
    finally:
        server.close()
        await server.wait_closed()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    answer, _, _ = await ask(agent, f"check port {closed} on 127.0.0.1")
    assert answer == f"127.0.0.1:{closed} is not reachable (127.0.0.1: connection refused)."
    answer, _, result = await ask(agent, "check port 443 on example.com")
    assert result.tool_calls[0].status == "error" and "not allowed" in answer


async def test_history_question_uses_search(tmp_path):
    calls = []

    async def search(user_id, query, session_id=None, k=5):
        calls.append((user_id, query, session_id, k))
        return [{"session_id": "s_1", "title": "nginx setup", "message_id": 3, "role": "user",
                 "snippet": "how do I reload nginx config", "timestamp": "2026-11-20T10:00:00+00:00", "score": 2.5}]

    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(), search=search))
    answer, _, _ = await ask_any(agent, "what did I ask about nginx earlier?")
    assert calls == [("alice", "nginx", None, 5)]
    assert "Found 1 earlier message(s) about 'nginx'" in answer and "how do I reload nginx config" in answer
    answer, _, _ = await ask_any(agent, "我之前问过redis什么")
    assert calls[-1][1] == "redis" and "how do I reload nginx config" in answer
    unavailable = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig()))
    answer, _, _ = await ask_any(unavailable, "what did I ask about nginx earlier")
    assert "history search is unavailable" in answer


async def ask_any(agent: OfflineAgent, text: str):
    sink = RecordingSink()
    result = await agent.run_turn(make_request(text), sink)
    return result.content, sink, result


async def test_read_log_under_root(agent, tmp_path):
    (tmp_path / "app.log").write_text("".join(f"line {i}\n" for i in range(100)))
    answer, _, _ = await ask(agent, f"tail -n 3 lines {tmp_path}/app.log")
    assert answer.endswith("```\nline 97\nline 98\nline 99\n```")
    answer, _, _ = await ask(agent, "查看日志 app.log 最后 2 行")
    assert "line 98\nline 99" in answer and "line 97" not in answer
    answer, _, _ = await ask(agent, "tail /etc/passwd logs")
    assert "outside the allowed log directories" in answer and "root:" not in answer


async def test_clock_and_uptime(agent):
    answer, _, _ = await ask(agent, "what time is it?")
    m = re.search(r"UTC time (\d\d):(\d\d):(\d\d)\.$", answer)
    assert m, answer
    now = datetime.now(timezone.utc)
    said = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
    actual = now.hour * 3600 + now.minute * 60 + now.second
    assert min((actual - said) % 86400, (said - actual) % 86400) <= 60
    answer, _, _ = await ask(agent, "现在几点")
    assert answer.startswith("现在是 ") and str(datetime.now().year) in answer
    answer, _, _ = await ask(agent, "uptime")
    assert answer.startswith("Uptime: ")


async def test_overview_runs_one_all_metrics_call(agent):
    answer, _, result = await ask(agent, "系统状态")
    assert [c.arguments for c in result.tool_calls] == [{"metric": "all"}]
    for part in ("系统概况", "CPU 使用率", "系统负载", "内存", "磁盘使用情况", "已运行"):
        assert part in answer


async def test_help_and_unknown_requests(agent):
    answer, sink, result = await ask(agent, "你好")
    assert "离线助手" in answer and result.tool_calls == [] and "tool_call" not in sink.kinds
    answer, _, result = await ask(agent, "write me a poem about the sea")
    assert answer.startswith("Sorry, the offline assistant cannot handle that request.")
    assert "NPLT_LLM_API_KEY" in answer and "NPLT_LLM_PROVIDER" in answer
    assert result.metadata["intents"] == ["unknown"] and result.finish_reason == "stop"
    assert result.metadata["canned"] is True and "what did I ask" not in answer   # no example requests


@pytest.mark.parametrize("text, expected", [
    ("Remember that the staging server is stage-7.internal", "Noted:\n- The staging server is stage-7.internal"),
    ("记住我们的备份服务器在杭州机房。以后用中文回答。", "好的，记下了：\n- 我们的备份服务器在杭州机房。\n- 以后用中文回答。"),
])
async def test_a_message_that_only_states_facts_is_acknowledged_with_what_is_kept(agent, text, expected):
    answer, sink, result = await ask(agent, text)
    assert answer == expected and result.tool_calls == [] and "tool_call" not in sink.kinds
    assert result.metadata["intents"] == ["note"] and "canned" not in result.metadata


def _with_memory(text: str, *lines: str) -> list[dict]:
    from server.memory.context import MEMORY_HEADER
    return [{"role": "system", "content": "sys"},
            {"role": "system", "content": MEMORY_HEADER + "\n" + "\n".join(f"- {line}" for line in lines)},
            {"role": "user", "content": text}]


@pytest.mark.parametrize("text, expected", [
    ("what is the staging server?", "From what you told me earlier:\n- The staging server is stage-7.internal "
                                    "(session s_a, 2026-11-20 10:15 UTC)"),
    ("我们的备份服务器在哪里？", "根据你之前告诉我的：\n- 我们的备份服务器在杭州机房。（会话 s_b，2026-11-21 09:00 UTC）"),
])
async def test_a_question_answered_by_a_remembered_item_quotes_it_with_its_session(agent, text, expected):
    lines = ("Always answer briefly (session s_c, 2026-11-19 08:00 UTC)",
             "The staging server is stage-7.internal (session s_a, 2026-11-20 10:15 UTC)",
             "我们的备份服务器在杭州机房。 (session s_b, 2026-11-21 09:00 UTC)")
    sink = RecordingSink()
    result = await agent.run_turn(make_request(text, context=_with_memory(text, *lines), model="offline"), sink)
    assert result.content == expected and result.tool_calls == []
    assert result.metadata["intents"] == ["memory"] and "canned" not in result.metadata


async def test_a_fact_stated_earlier_in_this_conversation_answers_a_question(agent):
    context = [{"role": "system", "content": "sys"},
               {"role": "user", "content": "remember that the staging server is stage-7.internal"},
               {"role": "assistant", "content": "Noted:\n- The staging server is stage-7.internal"},
               {"role": "user", "content": "what did I ask about the CPU earlier?"},
               {"role": "assistant", "content": "Found 1 earlier message(s) ... [notes.md §lines 1-2]"},
               {"role": "user", "content": "what is the staging server?"}]
    result = await agent.run_turn(make_request("what is the staging server?", context=context, model="offline"),
                                  RecordingSink())
    assert result.content == ("From what you told me earlier:\n- The staging server is stage-7.internal "
                              "(earlier in this conversation)")


async def test_a_remembered_item_that_does_not_answer_the_question_is_not_quoted(agent):
    text = "write me a poem about the staging area"
    context = _with_memory(text, "The staging server is stage-7.internal (session s_a, 2026-11-20 10:15 UTC)")
    result = await agent.run_turn(make_request(text, context=context, model="offline"), RecordingSink())
    assert result.content.startswith("Sorry, the offline assistant cannot handle") and result.metadata["canned"]


async def test_what_do_you_remember_about_me_lists_only_this_users_items(tmp_path):
    from server.memory.user_store import MemoryItem
    items = {"alice": [MemoryItem("m1", "fact", "The staging server is stage-7.internal", "s_a", 2,
                                  "2026-11-20T10:15:30+00:00"),
                       MemoryItem("m2", "preference", "以后用中文回答。", "s_b", 4, "2026-11-21T09:00:00+00:00")],
             "bob": []}

    async def remembered(user_id):
        return items.get(user_id)
    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(), memory_items=remembered))
    result = await agent.run_turn(make_request("what do you remember about me?", model="offline"), RecordingSink())
    assert result.content == ("I remember 2 thing(s) about you (newest first):\n"
                              "- 以后用中文回答。 (preference; session s_b, 2026-11-21 09:00 UTC)\n"
                              "- The staging server is stage-7.internal (fact; session s_a, 2026-11-20 10:15 UTC)")
    assert [c.tool_name for c in result.tool_calls] == ["user_memory"] and result.metadata["intents"] == ["remembered"]
    bob = await agent.run_turn(make_request("你记得我什么？", model="offline", user_id="bob"), RecordingSink())
    assert bob.content.startswith("我还没有记住关于你的任何信息") and "stage-7" not in bob.content
    carol = await agent.run_turn(make_request("what do you remember about me?", model="offline", user_id="carol"),
                                 RecordingSink())                      # None: long-term memory turned off
    assert carol.content == "Long-term memory is turned off on this server."
    bare = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig()))   # no memory layer: no such tool
    result = await bare.run_turn(make_request("what do you remember about me?", model="offline"), RecordingSink())
    assert result.metadata["canned"] and result.tool_calls == []


async def test_a_question_with_a_fact_in_it_is_answered_not_noted(agent):
    answer, _, result = await ask(agent, "my name is Bob. what is the CPU usage?")
    assert answer.startswith("CPU usage: ") and result.metadata["intents"] != ["note"]


async def test_tool_answers_are_not_marked_canned(agent):
    _, _, result = await ask(agent, "CPU usage")
    assert "canned" not in result.metadata


async def test_two_intents_run_concurrently_in_one_step(agent):
    answer, sink, result = await ask(agent, "CPU和内存怎么样")
    assert [c.arguments["metric"] for c in result.tool_calls] == ["cpu", "memory"]
    assert sink.kinds[1:4] == ["status:tool_call", "tool_call", "tool_call"]
    assert "CPU 使用率" in answer and "内存：" in answer


async def test_of_several_statements_about_one_thing_only_the_newest_is_quoted(agent):
    question = "what is the staging server?"
    context = [{"role": "system", "content": "sys"},
               {"role": "user", "content": "remember that the staging server is stage-7.internal"},
               {"role": "assistant", "content": "Noted"},
               {"role": "user", "content": "The staging server is stage-8.internal now."},
               {"role": "assistant", "content": "Noted"},
               {"role": "user", "content": question}]
    result = await agent.run_turn(make_request(question, context=context, model="offline"), RecordingSink())
    assert result.content == ("From what you told me earlier:\n- The staging server is stage-8.internal now. "
                              "(earlier in this conversation)")
    # said later in another session (the memory block): that one, not this conversation's older one
    block = _with_memory(question, "The staging server is stage-9.internal (session s_b, 2026-11-27 09:00 UTC)")
    result = await agent.run_turn(make_request(question, context=context[:-1] + block[1:], model="offline"),
                                  RecordingSink())
    assert result.content == ("From what you told me earlier:\n- The staging server is stage-9.internal "
                              "(session s_b, 2026-11-27 09:00 UTC)")
    # named by a title the user gave the session, even one that looks like the source part itself
    line = 'The staging server is stage-9.internal (session "Ops (session notes", 2026-11-27 09:00 UTC)'
    block = _with_memory(question, line)
    result = await agent.run_turn(make_request(question, context=context[:-1] + block[1:], model="offline"),
                                  RecordingSink())
    assert result.content == f"From what you told me earlier:\n- {line}"


async def test_with_long_term_memory_turned_off_nothing_claims_to_be_kept(tmp_path):
    from server.config import ServerConfig
    from server.wiring import build_runtime

    config = ServerConfig.from_dict({"storage": {"root": str(tmp_path)}, "user_memory": {"enabled": False}}, env={})
    agent, _ = build_runtime(config, None, lambda *a, **k: None, memory="basic")
    assert "user_memory" not in agent.registry.names          # not offered to a model either
    result = await agent.run_turn(make_request("remember that the staging server is stage-7.internal",
                                               model="offline"), RecordingSink())
    assert result.content.startswith("Long-term memory is turned off on this server, so this stays in this "
                                     "conversation only:") and "Noted" not in result.content
    result = await agent.run_turn(make_request("记住我们的备份服务器在杭州机房", model="offline"), RecordingSink())
    assert result.content.startswith("这台服务器关闭了长期记忆，以下内容只保留在本次对话中：")
    result = await agent.run_turn(make_request("what do you remember about me?", model="offline"), RecordingSink())
    assert result.content == "Long-term memory is turned off on this server." and result.tool_calls == []

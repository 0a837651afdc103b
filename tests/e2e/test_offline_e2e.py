"""The offline agent end to end: production wiring, real tools on this machine, real loopback TCP.

Each request goes CHAT_TEXT -> TURN_START, thinking, tool_call, TOOL_CALL, TOOL_RESULT, generating,
ANSWER_DELTA..., TURN_END; the stored assistant message (read back with HISTORY_REQUEST) carries the
same ToolCall records; the answer is in the question's language and quotes the tool's real numbers.
"""
from __future__ import annotations

import asyncio
import datetime as dt

import psutil
import pytest

from e2e_testlib import CJK, T, calls_of, chat, check_stored, check_turn, names, real_server, result_of
from server.tools.units import fmt_bytes
from testkit.server import V3Client

OFFLINE_AGENT = {"name": "offline", "offline": True, "model": "offline"}
TOOL_TURN = ["TURN_START", "STATUS:thinking", "STATUS:tool_call", "TOOL_CALL", "TOOL_RESULT",
             "STATUS:generating", "ANSWER_DELTA", "TURN_END"]


def check_language(answer: str, zh: bool) -> None:
    assert bool(CJK.search(answer)) is zh, answer


async def one_tool_turn(client: V3Client, text: str, tool: str, arguments: dict) -> tuple[dict, str]:
    """Run a turn that must make exactly one tool call; returns (tool result, answer)."""
    _, events = await chat(client, text)
    assert names(events) == TOOL_TURN, names(events)
    message = check_turn(events, text, tools=1)
    [running] = calls_of(events, T.TOOL_CALL)
    [call] = calls_of(events, T.TOOL_RESULT)
    assert running["id"] == call["id"] and running["tool_name"] == call["tool_name"] == tool
    assert call["arguments"] == arguments and call["status"] == "success", call
    assert call["step"] == 0 and call["duration"] > 0
    stored = await check_stored(client, events)
    assert stored["metadata"]["model"] == "offline" and stored["metadata"]["finish_reason"] == "stop"
    check_language(message["content"], CJK.search(text) is not None)
    return result_of(call), message["content"]


async def test_hello_stats_and_models_label_the_offline_agent(tmp_path):
    async with real_server(tmp_path) as (srv, addr):
        assert type(srv.memory).__name__ == "MemoryManager"       # the real memory layer is wired
        c = await V3Client.connect(addr)
        assert c.hello["agent"] == OFFLINE_AGENT
        assert (await c.call(T.STATS))["agent"] == OFFLINE_AGENT
        models = await c.call(T.MODEL_LIST)
        assert models["models"] == [{"name": "offline", "offline": True, "default": True}]
        assert models["current"] == "offline"
        await c.close()


async def test_cpu_in_chinese(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        data, answer = await one_tool_turn(c, "查看CPU使用率", "sys_monitor", {"metric": "cpu"})
        cpu = data["cpu"]
        assert 0.0 <= cpu["percent"] <= 100.0 and cpu["cores_logical"] == psutil.cpu_count()
        assert len(cpu["per_core"]) == psutil.cpu_count()
        assert f"CPU 使用率：{cpu['percent']}%" in answer
        assert all(f"{core}%" in answer for core in cpu["per_core"])
        await c.close()


async def test_memory_in_chinese(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        data, answer = await one_tool_turn(c, "内存还剩多少", "sys_monitor", {"metric": "memory"})
        mem = data["memory"]
        assert mem["total"] == fmt_bytes(psutil.virtual_memory().total)
        assert 0.0 < mem["percent"] < 100.0
        assert f"共 {mem['total']}" in answer and f"可用 {mem['available']}" in answer
        await c.close()


async def test_disk_usage_in_english(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        data, answer = await one_tool_turn(c, "show disk usage", "sys_monitor", {"metric": "disk"})
        filesystems = data["disk"]["filesystems"]
        assert filesystems and answer.startswith("Disk usage:")
        for fs in filesystems:
            assert fs["total"] == fmt_bytes(psutil.disk_usage(fs["mount"]).total)
            assert f"- {fs['mount']} ({fs['fstype']}" in answer and f"of {fs['total']} ({fs['percent']}%)" in answer
        await c.close()


async def test_top_processes_by_memory_in_english(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        data, answer = await one_tool_turn(c, "top processes by memory", "processes",
                                           {"sort_by": "memory", "limit": 10})
        procs = data["processes"]
        assert data["sort_by"] == "memory" and 0 < len(procs) <= 10
        assert data["total_processes"] >= len(procs)
        shares = [p["memory_percent"] for p in procs]
        assert shares == sorted(shares, reverse=True)
        for i, p in enumerate(procs, 1):
            assert f"{i}. {p['name']} (pid {p['pid']}" in answer and f"RSS {p['rss']}" in answer
        await c.close()


async def test_port_check_in_chinese_reaches_a_real_listener(tmp_path):
    accepted = asyncio.Event()

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with real_server(tmp_path) as (_, addr):
            c = await V3Client.connect(addr)
            data, answer = await one_tool_turn(c, f"检查 127.0.0.1:{port} 端口", "network_check",
                                               {"host": "127.0.0.1", "port": port})
            await asyncio.wait_for(accepted.wait(), 10)       # the tool really connected to our listener
            assert data["reachable"] is True and data["address"] == "127.0.0.1" and data["port"] == port
            assert f"127.0.0.1:{port} 可以连通" in answer and f"{data['latency_ms']} 毫秒" in answer
            await c.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_clock_in_chinese(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        data, answer = await one_tool_turn(c, "现在几点", "clock", {})
        utc = dt.datetime.fromisoformat(data["utc"])
        assert abs((dt.datetime.now(dt.timezone.utc) - utc).total_seconds()) < 60
        assert f"现在是 {data['local'].replace('T', ' ')[:19]}" in answer and data["timezone"] in answer
        await c.close()


async def test_history_question_finds_the_earlier_nginx_turn_across_sessions(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        first, events = await chat(c, "how do I restart nginx without dropping connections?")
        check_turn(events, "how do I restart nginx without dropping connections?", tools=0)
        earlier_session = c.session_id
        await c.call(T.SESSION_NEW, title="later")             # ask from another conversation
        data, answer = await one_tool_turn(c, "what did I ask about nginx earlier", "history_search",
                                           {"query": "nginx", "limit": 5, "current_session_only": False})
        top = data["hits"][0]
        assert top["session_id"] == earlier_session and top["message_id"] == first["user_message"]["id"]
        assert "nginx" in top["snippet"]
        assert answer.startswith("Found ") and "about 'nginx'" in answer
        assert "how do I restart nginx without dropping connections?" in answer
        assert first["user_message"]["timestamp"][:16].replace("T", " ") in answer   # when it was asked
        await c.close()


@pytest.mark.parametrize("text,zh", [("write me a poem about the sea", False),
                                     ("给我写一首关于大海的诗", True)])
async def test_unrecognized_request_says_so_and_shows_how_to_configure_an_llm(tmp_path, text, zh):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        _, events = await chat(c, text)
        assert names(events) == ["TURN_START", "STATUS:thinking", "STATUS:generating", "ANSWER_DELTA", "TURN_END"]
        answer = check_turn(events, text, tools=0)["content"]
        assert sum(e.type == T.ANSWER_DELTA for e in events) > 1        # streamed in pieces
        lead = ("抱歉，离线助手无法理解这个请求。" if zh
                else "Sorry, the offline assistant cannot handle that request.")
        assert answer.startswith(lead)
        assert "NPLT_LLM_PROVIDER" in answer and "NPLT_LLM_API_KEY" in answer
        check_language(answer, zh)
        stored = await check_stored(c, events)
        assert stored["tool_calls"] == [] and stored["metadata"]["intents"] == ["unknown"]
        await c.close()


async def test_two_intents_run_concurrently_in_one_step(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        _, events = await chat(c, "CPU和内存怎么样")
        message = check_turn(events, "CPU和内存怎么样", tools=2)
        order = [e.type for e in events if e.type in (T.TOOL_CALL, T.TOOL_RESULT)]
        assert order == [T.TOOL_CALL, T.TOOL_CALL, T.TOOL_RESULT, T.TOOL_RESULT]   # both announced, then both ran
        assert {c_["arguments"]["metric"] for c_ in calls_of(events, T.TOOL_RESULT)} == {"cpu", "memory"}
        assert "CPU 使用率" in message["content"] and "内存：" in message["content"]
        await check_stored(c, events)
        await c.close()


async def test_search_and_recall_do_not_match_the_canned_replies(tmp_path):
    """Issue 16: the reply to unknown requests quoted "what did I ask about nginx earlier", so a search
    for nginx found the canned text 4 times out of 5; the help reply lists "show disk usage", so a
    search for disk usage found it. Canned replies are left out of history search and recall."""
    async with real_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        asked, _ = await chat(c, "how do I restart nginx gracefully?")
        canned = []
        for text in ("help", "write me a poem", "tell me a joke", "帮助", "给我写一首诗"):
            _, events = await chat(c, text)
            canned.append(events[-1].body["message"])
        assert all(m["metadata"]["canned"] is True for m in canned)
        assert not any("nginx" in m["content"] for m in canned)
        hits = (await c.call(T.HISTORY_SEARCH, query="nginx"))["hits"]
        assert [(h["role"], h["message_id"]) for h in hits] == [("user", asked["user_message"]["id"])]
        assert "disk usage" in canned[0]["content"].lower()          # the help reply
        assert (await c.call(T.HISTORY_SEARCH, query="disk usage"))["hits"] == []
        assert (await c.call(T.HISTORY_SEARCH, query="disk usage", session_id=c.session_id))["hits"] == []
        assert await srv.services.memory.search("local", "disk usage") == []     # the recall index
        recalled = await srv.services.memory.search("local", "help")             # the question stays indexed
        assert recalled[0]["message_id"] == canned[0]["id"] - 1
        assert not any("disk" in h["snippet"].lower() for h in recalled)
        await c.call(T.SESSION_NEW, title="later")
        data, _ = await one_tool_turn(c, "what did I ask about nginx earlier", "history_search",
                                      {"query": "nginx", "limit": 5, "current_session_only": False})
        assert data["hits"] and {h["role"] for h in data["hits"]} == {"user"}     # no canned reply
        assert asked["user_message"]["id"] in [h["message_id"] for h in data["hits"]]
        await c.close()


async def test_the_automatic_title_has_no_markdown(tmp_path):
    async with real_server(tmp_path) as (_, addr):
        c = await V3Client.connect(addr)
        await chat(c, "## Why is **nginx** returning `502`? See [the logs](https://example.com)")
        info = await c.call(T.SESSION_INFO, session_id=c.session_id)
        assert info["session"]["title"] == "Why is nginx returning 502? See the logs"
        await c.close()

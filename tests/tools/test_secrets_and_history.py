"""No tool output ever contains a secret; history_search calls the injected search for this user."""
from __future__ import annotations

import asyncio

import orjson
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.secrets import MASK, redact

SECRET = "sk-secret-4242424242"
CTX = ToolContext("alice", "s_1")


async def test_no_tool_output_contains_env_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("NPLT_LLM_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "-oa")
    (tmp_path / "app.log").write_text(f"boot ok\nusing key {SECRET}\nOPENAI_API_KEY={SECRET}-oa\n")

    async def search(user_id, query, session_id=None, k=5):
        return [{"snippet": f"my key is {SECRET}"}]

    tools = ToolRegistry(ToolsConfig(log_roots=[str(tmp_path)], cpu_sample_s=0.02), search=search)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    calls = [("sys_monitor", {"metric": "all"}), ("processes", {"limit": 50}), ("clock", {}),
             ("network_check", {"host": "127.0.0.1", "port": port}), ("read_log", {"path": "app.log"}),
             ("history_search", {"query": "key"}), ("nope", {"x": SECRET}), ("sys_monitor", SECRET)]
    try:
        results = [await tools.run(name, args, CTX) for name, args in calls]
    finally:
        server.close()
        await server.wait_closed()
    assert [r.status for r in results[:6]] == ["success"] * 6
    for r in results:
        assert SECRET not in r.result, r.tool_name
    log_text = orjson.loads(results[4].result)["text"]
    assert log_text == f"boot ok\nusing key {MASK}\nOPENAI_API_KEY={MASK}"
    assert MASK in orjson.loads(results[5].result)["hits"][0]["snippet"]


async def test_registered_secret_is_scrubbed(tmp_path):
    (tmp_path / "a.log").write_text("token=abcdef123456\n")
    tools = ToolRegistry(ToolsConfig(log_roots=[str(tmp_path)]))
    tools.add_secret("abcdef123456")
    call = await tools.run("read_log", {"path": "a.log"}, CTX)
    assert "abcdef123456" not in call.result and MASK in call.result


def test_redact_ignores_short_values(monkeypatch):
    monkeypatch.setenv("SOME_TOKEN", "abc")
    assert redact("abc abcdefgh", extra=["abcdefgh"]) == f"abc {MASK}"


async def test_history_search_scopes_and_limits():
    seen = []

    async def search(user_id, query, session_id=None, k=5):
        seen.append((user_id, query, session_id, k))
        return [{"session_id": "s_1", "snippet": "x" * 1000, "score": 1.0}] * 10

    tools = ToolRegistry(ToolsConfig(), search=search)
    call = await tools.run("history_search", {"query": "nginx reload", "limit": 3, "current_session_only": True}, CTX)
    d = orjson.loads(call.result)
    assert seen == [("alice", "nginx reload", "s_1", 3)]
    assert d["scope"] == "session" and len(d["hits"]) == 3 and len(d["hits"][0]["snippet"]) == 301
    await tools.run("history_search", {"query": "nginx"}, ToolContext("bob", "s_9"))
    assert seen[-1] == ("bob", "nginx", None, 5)


async def test_history_search_failures_are_reported():
    async def broken(user_id, query, session_id=None, k=5):
        raise OSError("disk gone")

    call = await ToolRegistry(ToolsConfig(), search=broken).run("history_search", {"query": "x"}, CTX)
    assert call.status == "error" and orjson.loads(call.result) == {"error": "history search failed (OSError)"}
    call = await ToolRegistry(ToolsConfig()).run("history_search", {"query": "x"}, CTX)
    assert call.status == "error" and "unavailable" in call.result


@pytest.mark.parametrize("query", ["", "x" * 201])
async def test_history_query_length(query):
    call = await ToolRegistry(ToolsConfig()).run("history_search", {"query": query}, CTX)
    assert call.status == "error" and "argument 'query'" in call.result

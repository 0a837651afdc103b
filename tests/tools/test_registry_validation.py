"""ToolRegistry.run never raises: precise errors for bad calls, timeouts, ToolCall records."""
from __future__ import annotations

import asyncio

import orjson
import pytest

from server.config_base import ConfigError
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.schema import RAW_ARGUMENTS

CTX = ToolContext("alice", "s_1")


@pytest.fixture
def tools() -> ToolRegistry:
    return ToolRegistry(ToolsConfig(cpu_sample_s=0.02))


def test_schemas_are_openai_tools():
    tools = ToolRegistry(ToolsConfig(max_processes=20, max_log_lines=80))
    schemas = {s["function"]["name"]: s for s in tools.schemas()}
    assert set(schemas) == {"sys_monitor", "processes", "network_check", "read_log", "list_dir", "read_file",
                            "search_files", "history_search", "clock"}
    for s in schemas.values():
        assert s["type"] == "function" and s["function"]["description"]
        assert s["function"]["parameters"]["type"] == "object"
    assert schemas["processes"]["function"]["parameters"]["properties"]["limit"]["maximum"] == 20
    assert schemas["read_log"]["function"]["parameters"]["properties"]["lines"]["maximum"] == 80
    assert schemas["network_check"]["function"]["parameters"]["required"] == ["host", "port"]


@pytest.mark.parametrize("name,args,error", [
    # no log or file roots: read_log and the file tools are not offered
    ("nope", {}, "unknown tool 'nope' (available: sys_monitor, processes, network_check, history_search, clock)"),
    ("sys_monitor", "[1, 2]", "arguments must be a JSON object, got list"),
    ("sys_monitor", {"metric": "gpu"}, "argument 'metric': expected one of 'cpu', 'memory', 'disk', 'network', "
                                       "'load', 'uptime', 'all', got 'gpu'"),
    ("sys_monitor", {"metrics": "cpu"}, "unknown argument 'metrics' (allowed: metric)"),
    ("processes", {"limit": 0}, "argument 'limit': expected an integer in 1..50, got 0"),
    ("processes", {"limit": True}, "argument 'limit': expected an integer in 1..50, got boolean True"),
    ("processes", {"limit": 2.5}, "argument 'limit': expected an integer in 1..50, got number 2.5"),
    ("processes", {"sort_by": 1}, "argument 'sort_by': expected one of 'cpu', 'memory', got 1"),
    ("processes", {"name": ""}, "argument 'name': expected at least 1 character(s), got 0"),
    ("network_check", {"host": "localhost"}, "missing required argument 'port'"),
    ("network_check", {"host": "localhost", "port": 70000}, "argument 'port': expected an integer in 1..65535, "
                                                            "got 70000"),
    ("network_check", {"host": 5, "port": 1}, "argument 'host': expected a string, got integer 5"),
    ("history_search", {"query": "x", "current_session_only": "yes"},
     "argument 'current_session_only': expected true or false, got string 'yes'"),
    ("clock", {"tz": "UTC"}, "unknown argument 'tz' (allowed: none)"),
])
async def test_precise_errors(tools, name, args, error):
    call = await tools.run(name, args, CTX, call_id="call_x", step=3)
    assert call.status == "error"
    assert orjson.loads(call.result) == {"error": error}
    assert (call.id, call.tool_name, call.step) == ("call_x", name, 3)


async def test_malformed_json_arguments_are_kept_for_the_record(tools):
    call = await tools.run("sys_monitor", '{"metric": cpu', CTX)
    assert call.status == "error"
    assert orjson.loads(call.result)["error"].startswith("arguments are not valid JSON (")
    assert call.arguments == {RAW_ARGUMENTS: '{"metric": cpu'}
    assert call.id.startswith("call_") and call.duration >= 0


async def test_empty_string_arguments_mean_defaults(tools):
    call = await tools.run("processes", "", CTX)
    assert call.status == "success" and call.arguments == {"sort_by": "cpu", "limit": 10}
    assert (await tools.run("processes", {"limit": 3.0}, CTX)).arguments["limit"] == 3


async def test_timeout_status():
    never = asyncio.Event()

    async def search(user_id, query, session_id=None, k=5):
        await never.wait()
        return []

    tools = ToolRegistry(ToolsConfig(timeout_s=0.1, search_timeout_s=0.05), search=search)
    call = await tools.run("history_search", {"query": "x"}, CTX)
    assert call.status == "timeout"
    assert orjson.loads(call.result) == {"error": "tool 'history_search' timed out after 0.1 s"}
    capped = await ToolRegistry(ToolsConfig(timeout_s=5, search_timeout_s=1), search=search).run(
        "history_search", {"query": "x"}, CTX, timeout=0.1)
    assert capped.status == "timeout"


async def test_pending_call_record(tools):
    p = tools.pending("clock", "{}", "call_1", 2)
    assert (p.id, p.status, p.result, p.duration, p.step, p.arguments) == ("call_1", "running", "", 0.0, 2, {})


async def test_oversized_results_are_capped():
    async def search(user_id, query, session_id=None, k=5):
        return [{"snippet": "x" * 250, "title": "t" * 400} for _ in range(k)]

    tools = ToolRegistry(ToolsConfig(max_result_chars=1000), search=search)
    call = await tools.run("history_search", {"query": "x", "limit": 20}, CTX)
    assert call.status == "success" and len(call.result) <= 1000
    assert orjson.loads(call.result)["truncated"] is True


@pytest.mark.parametrize("d,path", [
    ({"allowed_hosts": "localhost"}, "tools.allowed_hosts"),
    ({"allowed_hosts": ["10.0.0.0/33"]}, "tools.allowed_hosts"),
    ({"log_roots": ["var/log"]}, "tools.log_roots"),
    ({"max_log_lines": 0}, "tools.max_log_lines"),
    ({"network_timeout_s": 20, "max_network_timeout_s": 5}, "tools.network_timeout_s"),
    ({"shell": True}, "tools.shell"),
])
def test_tools_config_errors(d, path):
    with pytest.raises(ConfigError) as err:
        ToolsConfig.from_dict(d)
    assert err.value.path == path


def test_tools_config_defaults():
    cfg = ToolsConfig.from_dict({})
    assert cfg.allowed_hosts == ["127.0.0.1", "::1", "localhost"] and cfg.log_roots == []
    assert ToolsConfig.from_dict({"allowed_hosts": ["DB.Internal", "10.0.0.0/8"]}).allowed_hosts == \
        ["db.internal", "10.0.0.0/8"]

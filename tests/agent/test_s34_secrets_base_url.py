"""Credentials in the LLM base_url never reach users nor the log (review s34, t9.py).

NPLT_LLM_BASE_URL=http://svc:PASSWORD@host/v1?api-key=KEY put ``svc:PASSWORD@host`` in every TURN_ERROR
(and the stored ``metadata.error_message``: history, export), and the server log had it three ways: the
start-up line "agent: openai-compatible at ...", httpx's "HTTP Request: POST <full URL>" at INFO, and the
model catalog's warning. ``endpoint_host`` now gives host[:port] only; the base_url's password and
secret-looking query values (``url_secrets``) are scrubbed from error texts and registered with the tools;
the HTTP client loggers (``logs.QUIET_LOGGERS``) are held at WARNING. (A base_url with a query string is
refused at start-up since fixer C2: tests/agent/test_s34_baseurl_refused.py; ``url_secrets`` still reads
a query, as a second line of defence.)
"""
from __future__ import annotations

import logging
from pathlib import Path

import httpx2
import openai
import orjson
import pytest

from protocol import MsgType
from server.agent.config import AgentConfig, LLMConfig
from server.agent.factory import build_agent
from server import logs
from server.agent import llm_support
from server.agent.llm_support import endpoint_host, to_agent_error
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from testkit.process import ServerProcess
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client

PASSWORD, QUERY_KEY, API_KEY = "UrlUserPa55word", "QueryKeyVal0123456789", "cfgKeyValue0123456789zz"
SECRETS = [PASSWORD, QUERY_KEY, API_KEY]


@pytest.mark.parametrize("url,host", [
    ("http://svc:UrlUserPa55word@127.0.0.1:40855/v1", "127.0.0.1:40855"),
    ("https://svc:p%40ss@llm.example.com/v1?api-key=K", "llm.example.com"),
    ("http://user:pa@ss@llm.example.com:8080/v1", "llm.example.com:8080"),
    ("https://KEY0123456789abcdef@llm.example.com", "llm.example.com"),
    ("http://[::1]:8000/v1", "[::1]:8000"),
    ("http://u:p@[fe80::1]/v1", "[fe80::1]"),
    ("https://api.openai.com/v1", "api.openai.com"),
    ("http://llm.example.com:8000/v1?api-key=QueryKeyVal0123456789#frag", "llm.example.com:8000"),
    ("http://u:pa/ss@host/v1", "u"),        # an unencoded / in the password: never the password's part
    ("http://", "(unnamed endpoint)"),
])
def test_endpoint_host_is_host_and_port_only(url, host):
    assert endpoint_host(url) == host


def test_url_secrets():
    url_secrets = llm_support.url_secrets
    assert url_secrets(f"http://svc:{PASSWORD}@127.0.0.1:1/v1?api-key={QUERY_KEY}&api-version=2024-02-01") == (
        PASSWORD, QUERY_KEY)
    assert url_secrets("http://svc:p%40ssw0rd@h/v1") == ("p%40ssw0rd", "p@ssw0rd")
    assert url_secrets("https://KEY0123456789abcdef@h") == ("KEY0123456789abcdef",)
    assert url_secrets("https://ops@h/v1") == ()          # a user name alone that is no key
    assert url_secrets("http://u:pw@h/v1") == ()          # shorter than URL_SECRET_MIN_CHARS
    assert url_secrets("https://api.openai.com/v1") == url_secrets(None) == ()


def test_error_texts_name_the_host_and_never_the_secrets():
    base_url = f"http://svc:{PASSWORD}@127.0.0.1:40855/v1?api-key={QUERY_KEY}"
    request = httpx2.Request("POST", "http://127.0.0.1:40855/v1/chat/completions")
    body = {"error": {"message": f"bad request for key {API_KEY} at http://svc:{PASSWORD}@x?api-key={QUERY_KEY}"}}
    exc = openai.APIStatusError("x", response=httpx2.Response(400, request=request), body=body)
    message = str(to_agent_error(exc, base_url, 5.0, API_KEY))
    assert message.startswith("the model endpoint 127.0.0.1:40855 returned HTTP 400")
    assert not [s for s in SECRETS if s in message], message
    conn = openai.APIConnectionError(request=request)
    assert str(to_agent_error(conn, base_url, 5.0, API_KEY)) == "cannot connect to the model endpoint 127.0.0.1:40855"


async def test_the_tools_mask_the_base_url_secrets(tmp_path, caplog):
    (tmp_path / "env.txt").write_text(f"LLM_URL_PASS {PASSWORD}\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)]))
    cfg = LLMConfig.from_dict({"base_url": f"http://svc:{PASSWORD}@127.0.0.1:9/v1",
                               "model": "m", "models_from_endpoint": False}, env={})
    caplog.set_level(logging.INFO, logger="server.agent.factory")
    agent = build_agent(cfg, AgentConfig(), tools)
    try:
        call = await tools.run("read_file", {"path": "env.txt"}, ToolContext("alice", "s_1"))
        assert call.status == "success"
        assert orjson.loads(call.result)["text"] == "LLM_URL_PASS [REDACTED]"
        assert "agent: openai-compatible at 127.0.0.1:9, model m" in caplog.text
        assert not [s for s in SECRETS if s in caplog.text]
    finally:
        await agent.aclose()


def test_the_http_client_loggers_are_quiet_at_any_level():
    root = logging.getLogger()
    quiet = ("httpx", "httpx2", "httpcore", "httpcore2")
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in quiet})
    try:
        logs.setup_logging("debug")
        assert set(quiet) <= set(logs.QUIET_LOGGERS) and logs.QUIET_LOGGER_LEVEL == logging.WARNING
        for name in quiet:
            assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


async def test_a_real_server_keeps_the_base_url_secrets(tmp_path):
    """t9.py: a real server process whose base_url carries a password; the model endpoint answers 401
    naming the key and the URL it was given (a base_url with ?api-key= is refused at start-up now).
    Nothing the user sees (hello, the TURN_ERROR, stats, models, session info, history, export) nor the
    log (debug level, stderr and file) holds a secret; the errors name the endpoint by host and port."""
    data = tmp_path / "data"
    async with ScriptedLLM() as llm:
        llm.push(Reply.fail(401, f"bad key {API_KEY} for http://svc:{PASSWORD}@127.0.0.1:{llm.port}/v1"))
        url = f"http://svc:{PASSWORD}@127.0.0.1:{llm.port}/v1"
        env = {"NPLT_LLM_BASE_URL": url, "NPLT_LLM_MODEL": "scripted-model", "NPLT_LLM_API_KEY": API_KEY}
        srv = await ServerProcess.start(data, "--log-level", "debug", env=env)
        try:
            c = await V3Client.connect(srv.addr)
            blob = orjson.dumps(c.hello).decode()
            r = await c.call(MsgType.CHAT_TEXT, text="hi")
            events = await c.turn_events(r["turn_id"], timeout=30)
            blob += orjson.dumps([ev.body for ev in events]).decode()
            for kind in (MsgType.STATS, MsgType.MODEL_LIST, MsgType.SESSION_INFO, MsgType.HISTORY_REQUEST):
                blob += orjson.dumps(await c.call(kind)).decode()
            blob += (await c.call(MsgType.HISTORY_EXPORT, format="json"))["content"]
            await c.close()
        finally:
            assert await srv.stop() == 0
    assert len(llm.model_requests) + len(llm.requests) >= 1     # the endpoint was reached, through that URL
    [error] = [ev.body for ev in events if ev.type == MsgType.TURN_ERROR]
    assert error["message"].startswith(f"the model endpoint 127.0.0.1:{llm.port} returned HTTP 401"), error
    assert not [s for s in SECRETS if s in blob], blob
    log = srv.log_path.read_text() + "".join(p.read_text() for p in Path(data / "logs").glob("*.log*"))
    assert f"agent: openai-compatible at 127.0.0.1:{llm.port}, model scripted-model" in log
    leaks = [line for line in log.splitlines() if any(s in line for s in SECRETS)]
    assert not leaks, leaks


def test_the_config_repr_names_the_endpoint_by_host_and_port_only():
    from server.agent.config import LLMConfig
    shown = repr(LLMConfig(base_url="http://svc:UrlUserPa55word@llm.internal:8080/v1", api_key="sk-test"))
    assert "llm.internal:8080" in shown
    assert "UrlUserPa55word" not in shown and "sk-test" not in shown

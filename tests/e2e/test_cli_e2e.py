"""The scriptable CLI (``client.cli``, as ``nplt-client`` runs it) against the production server
wiring with the OpenAI-compatible agent: the real openai client talks to the scripted endpoint,
which records what the model was asked for (the model name, the system prompt)."""
from __future__ import annotations

import io
import json
import os
import sys

import pytest

from client import cli
from client.config import ClientConfig
from client.main import build_parser
from e2e_testlib import MODEL, OTHER_MODEL, llm_server
from server.agent.config import DEFAULT_SYSTEM_PROMPT
from testkit.scripted_llm import Reply


@pytest.fixture(autouse=True)
def no_user_client_config(tmp_path, monkeypatch):
    """No client config file or NPLT_CLIENT_* / XDG_* variable of the machine leaks in."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key in [k for k in os.environ if k.startswith(("NPLT_CLIENT_", "XDG_"))]:
        monkeypatch.delenv(key)


async def run(addr: tuple[str, int], *argv: str) -> tuple[int, str, str]:
    """One ``nplt-client`` command in-process: (exit code, stdout, stderr)."""
    args = build_parser().parse_args(["--host", addr[0], "--port", str(addr[1]), *argv])
    out, err = io.StringIO(), io.StringIO()
    code = await cli.run_command(args, ClientConfig.load(args), out, err)
    return code, out.getvalue(), err.getvalue()


def system_prompt_sent(body: dict) -> str:
    return body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""


async def test_ask_model_switches_the_sessions_model_for_this_and_later_turns(tmp_path):
    async with llm_server(tmp_path) as (_, addr, llm):
        llm.push(Reply.text("from a"))
        code, out, err = await run(addr, "ask", "which model?", "--json")
        assert code == 0, err
        first = json.loads(out)
        assert llm.requests[-1].body["model"] == MODEL                  # the default
        llm.push(Reply.text("from b"))
        code, out, err = await run(addr, "ask", "--session", first["session_id"], "--model", OTHER_MODEL,
                                   "and now?", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert llm.requests[-1].body["model"] == OTHER_MODEL
        assert doc["message"]["metadata"]["model"] == OTHER_MODEL and doc["session_id"] == first["session_id"]
        llm.push(Reply.text("still b"))                                  # later turns keep it
        code, _, err = await run(addr, "ask", "--session", first["session_id"], "later")
        assert code == 0, err
        assert llm.requests[-1].body["model"] == OTHER_MODEL
        asked = len(llm.requests)
        code, out, err = await run(addr, "ask", "--model", "no-such-model", "hello?")
        assert code == cli.EXIT_REQUEST and "UNKNOWN_MODEL" in err and out == ""
        assert len(llm.requests) == asked                               # nothing was sent
        llm.push(Reply.text("new and b"))                               # --new --model: the new session's
        code, out, err = await run(addr, "ask", "--new", "--model", OTHER_MODEL, "fresh start", "--json")
        assert code == 0, err
        assert llm.requests[-1].body["model"] == OTHER_MODEL
        assert json.loads(out)["session_id"] != first["session_id"]
        code, out, _ = await run(addr, "sessions", "--json")
        models = {s["session_id"]: s["model"] for s in json.loads(out)["sessions"]}
        assert models == {first["session_id"]: OTHER_MODEL, json.loads(out)["sessions"][0]["session_id"]: OTHER_MODEL}


async def test_prompt_command_and_ask_system_set_what_the_model_is_told(tmp_path, monkeypatch):
    async with llm_server(tmp_path) as (_, addr, llm):
        code, out, err = await run(addr, "prompt")                      # no session yet
        assert code == cli.EXIT_REQUEST and "NOT_FOUND" in err and "no current session" in err
        llm.push(Reply.text("Arr."))
        code, out, err = await run(addr, "ask", "--new", "--system", "You are a pirate.", "hello", "--json")
        assert code == 0, err
        sid = json.loads(out)["session_id"]
        assert system_prompt_sent(llm.requests[-1].body) == "You are a pirate."
        code, out, err = await run(addr, "prompt", "--session", sid)
        assert (code, out) == (0, "You are a pirate.\n")
        code, out, err = await run(addr, "prompt", "--session", sid, "Answer in French.")
        assert code == 0 and out.startswith(f"system prompt of {sid} set")
        llm.push(Reply.text("Bonjour."))
        assert (await run(addr, "ask", "--session", sid, "hi again"))[0] == 0
        assert system_prompt_sent(llm.requests[-1].body) == "Answer in French."
        monkeypatch.setattr(sys, "stdin", io.StringIO("Be brief.\nVery brief.\n"))
        code, out, err = await run(addr, "prompt", "-", "--json")          # the newest session; from stdin
        assert code == 0, err
        assert json.loads(out) == {"session_id": sid, "system_prompt": "Be brief.\nVery brief."}
        code, out, err = await run(addr, "prompt", "--session", sid, "--clear")
        assert code == 0 and "reset to the server's" in out
        code, out, err = await run(addr, "prompt", "--session", sid, "--json")
        assert json.loads(out) == {"session_id": sid, "system_prompt": None}
        code, out, err = await run(addr, "prompt", "--session", sid)
        assert code == 0 and out == "" and "server's system prompt" in err
        llm.push(Reply.text("Hello."))
        assert (await run(addr, "ask", "--session", sid, "and now?"))[0] == 0
        assert system_prompt_sent(llm.requests[-1].body) == DEFAULT_SYSTEM_PROMPT
        code, _, err = await run(addr, "prompt", "--session", sid, "x", "--clear")
        assert code == cli.EXIT_USAGE and "not both" in err
        code, _, err = await run(addr, "prompt", "--session", sid, "x" * 20_001)
        assert code == cli.EXIT_REQUEST and "INVALID_MESSAGE" in err

"""search_files, read_file and read_log decide on what they show: the redacted lines.

search_files used to match the raw text and redact only what it returned, so a pattern was an
oracle for a masked secret: ``^NPLT_LLM_API_KEY=sk-p`` matched (and was counted) when the key began
with "sk-p", and not for "sk-q", which read the key character by character (review p5). A private-key
block was masked only when its BEGIN line was in the same answer: its base64 lines came back in clear
from a search that matched them, from read_file with an offset inside the block and from the tail of
a log.
"""
from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.secrets import MASK, SECRET_SHAPES, LineRedactor, redact, redact_shapes

CTX = ToolContext("alice", "s_1")
KEY = "sk-proj-Q7x9Lm2Vb8"                  # too short for the sk- shape: only the registered value masks it
PASSWORD = "hunter2Hunter2"                 # masked by its shape (password=...)
PEM_BODY = ["MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
            "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK"]


@pytest.fixture
def tools(tmp_path):
    (tmp_path / "nplt-server").write_text(
        f"# environment of nplt-server\nNPLT_LLM_PROVIDER=openai\nNPLT_LLM_API_KEY={KEY}\n"
        f"DB_PASSWORD={PASSWORD}\n")
    (tmp_path / "app.yaml").write_text(
        "name: demo\ntls_key: |\n  -----BEGIN RSA PRIVATE KEY-----\n"
        + "".join(f"  {line}\n" for line in PEM_BODY) + "  -----END RSA PRIVATE KEY-----\nport: 80\n")
    registry = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)], log_roots=[str(tmp_path)]))
    registry.add_secret(KEY)
    return registry


async def run(tools, name, **args):
    call = await tools.run(name, args, CTX)
    assert call.status == "success", call.result
    return orjson.loads(call.result)


async def search(tools, pattern, **args):
    return await run(tools, "search_files", root="nplt-server", pattern=pattern, regex=True, **args)


@pytest.mark.parametrize("right,wrong", [
    ("^NPLT_LLM_API_KEY=" + re.escape(KEY[:4]), "^NPLT_LLM_API_KEY=sk-q"),        # the review's probe
    ("^NPLT_LLM_API_KEY=(sk-p|\\[REDACTED\\])", "^NPLT_LLM_API_KEY=(sk-q|\\[REDACTED\\])"),   # also true on the mask
    ("KEY=(sk-p|.{10}$)", "KEY=(sk-q|.{10}$)"),                                    # "[REDACTED]" is 10 long
    ("PASSWORD=" + PASSWORD[:3], "PASSWORD=xyz"),                                  # a secret shape, not a value
    ("PASSWORD=(hun|\\[)", "PASSWORD=(xyz|\\[)"),
])
async def test_a_pattern_cannot_tell_a_right_guess_from_a_wrong_one(tools, right, wrong):
    for limit in (1, 50):
        hit, miss = await search(tools, right, limit=limit), await search(tools, wrong, limit=limit)
        hit.pop("pattern"), miss.pop("pattern")
        assert hit == miss                         # matches, counts, truncation: all the same
        assert KEY not in str(hit) and PASSWORD not in str(hit)


async def test_a_redacted_line_is_found_by_what_it_shows(tools):
    found = await search(tools, "^NPLT_LLM_API_KEY=\\[REDACTED\\]$")
    assert [(m["line"], m["text"]) for m in found["matches"]] == [(3, f"NPLT_LLM_API_KEY={MASK}")]
    assert (await search(tools, "KEY=sk-"))["matches"] == []
    assert [m["text"] for m in (await search(tools, "PASSWORD"))["matches"]] == [f"DB_PASSWORD={MASK}"]
    plain = await search(tools, "PROVIDER=open")                     # lines without secrets: as before
    assert [(m["line"], m["text"]) for m in plain["matches"]] == [(2, "NPLT_LLM_PROVIDER=openai")]


async def test_a_private_key_block_stays_masked_in_every_view(tools):
    body = "^  [A-Za-z0-9+/=]{40,}$"
    found = await run(tools, "search_files", root=".", pattern=body, regex=True)
    assert found["matches"] == [] and found["returned"] == 0
    every = await run(tools, "search_files", root="app.yaml", pattern=".", regex=True)
    assert [(m["line"], m["text"]) for m in every["matches"]] == [
        (1, "name: demo"), (2, "tls_key: |"), (3, f"  {MASK}"), (4, MASK), (5, MASK), (6, MASK), (7, "port: 80")]
    assert every["returned"] == 7
    middle = await run(tools, "read_file", path="app.yaml", offset=4, lines=1)     # starts inside the block
    assert middle["text"] == MASK and middle["next_offset"] == 5
    whole = await run(tools, "read_file", path="app.yaml")
    assert whole["text"].split("\n") == ["name: demo", "tls_key: |", f"  {MASK}", MASK, MASK, MASK, "port: 80"]
    assert whole["lines_returned"] == 7
    tail = await run(tools, "read_log", path="app.yaml", lines=3)                  # the tail cuts the block
    assert tail["text"] == f"{MASK}\n{MASK}\nport: 80"
    for result in (found, every, middle, whole, tail):
        assert not any(line[:12] in str(result) for line in PEM_BODY)


async def test_a_long_line_is_cut_after_redaction(tmp_path):
    """Cutting first left the start of a key too short to look like one (max_line_chars, read budget)."""
    secret = "sk-" + "AbCdEfGhIjKlMnOpQrSt"
    (tmp_path / "long.log").write_text("x" * 490 + " " + secret + " tail\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)], max_line_chars=500))
    found = await run(tools, "search_files", root="long.log", pattern="x")
    assert found["matches"][0]["text"].endswith(MASK[:9] + "…") and "sk-Ab" not in str(found)


def test_the_line_redactor_keeps_lines_and_key_state():
    lines = ["a", "-----BEGIN OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXk", "", "-----END OPENSSH PRIVATE KEY-----",
             "token: abcd1234", "z"]
    assert LineRedactor().lines(lines) == ["a", MASK, MASK, MASK, MASK, f"token: {MASK}", "z"]
    redactor = LineRedactor()                    # across calls (search regions, read_file blocks)
    assert redactor.lines(lines[:3]) == ["a", MASK, MASK] and redactor.lines(lines[3:]) == [MASK, MASK,
                                                                                           f"token: {MASK}", "z"]
    tail = LineRedactor(mid_file=True)           # a window that starts inside a block
    assert tail.lines(lines[2:]) == [MASK, MASK, MASK, f"token: {MASK}", "z"]
    assert LineRedactor(mid_file=True).lines(["plain", "-----BEGIN RSA PRIVATE KEY-----", "x"]) == [
        "plain", MASK, MASK]


def _all_shapes(text: str) -> str:
    for pattern, repl in SECRET_SHAPES:
        text = pattern.sub(repl, text)
    return text


FRAGMENTS = ["password=", "DB_PASS: ", "token: ", "Bearer ", "Basic dXNlcjpwYXNz", "sk-proj-", "AKIA", "ghp_",
             "glpat-", "xoxb-", "AIza", "eyJhbGciOi", ".eyJzdWIi", "$6$", "$apr1$", "{SHA}", "postgres://u:",
             "@db", "mysql -u r -p", "sshpass -p ", "redis-cli -a ", "curl -u a:", "login bob password ",
             "--password ", "-passin pass:", "client-key-data: ", "LS0tLS1CRUdJTi", "auth: ", "Pwd=", "api_key=",
             "secret=", "\"token\": \"", "ı", "İ", "ſ", "\u212a", "\u00a0", "\u3000", "\x85", "\t", " ", "'", "\"",
             "\\", "=", ":", "中文", "é", "a1B2c3D4e5F6g7H8i9J0", "ABCDEFGHIJKLMNOP", "-", "_", "/", "+",
             "0123456789"]


@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8))
def test_redaction_runs_every_shape_that_can_match(parts):
    """The RE2 prefilter (derived from SECRET_SHAPES) must find every line a shape changes: redact_shapes
    and the line redactor skip what it does not find. Holds for any new shape the derivation accepts."""
    line = "".join(parts)
    for text in (line, orjson.dumps({"text": line}).decode()):
        assert redact_shapes(text) == _all_shapes(text)
    shown = orjson.loads(redact(orjson.dumps(line).decode()))
    assert LineRedactor().lines(["plain", line, "end"]) == ["plain", shown, "end"]

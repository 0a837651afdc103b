"""Secret-shaped values are masked in every tool result: one planted value of each kind in a real file,
read back through read_file, read_log and search_files."""
from __future__ import annotations

import orjson
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.secrets import MASK, redact

CTX = ToolContext("alice", "s_1")

PLANTED = {   # kind -> (line written to the file, the secret part that must never come back, what remains)
    "openai key": ("using key sk-proj-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx", "using key " + MASK),
    "anthropic key": ("k=sk-ant-api03-ZZZZZZZZZZZZZZZZZZZZ", "ZZZZZZZZZZZZZZZZZZZZ", None),
    "aws key id": ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", f"aws {MASK} here"),
    "github token": ("gh ghp_" + "a1B2" * 9, "a1B2" * 9, f"gh {MASK}"),
    "gitlab token": ("glpat-abcdefghij0123456789", "abcdefghij0123456789", MASK),
    "slack token": ("xoxb-123456789012-abcdefABCDEF", "123456789012-abcdefABCDEF", MASK),
    "google key": ("AIza" + "B" * 35, "B" * 35, MASK),
    "jwt": ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXZhbHVl", "c2lnbmF0dXJlLXZhbHVl",
            f"jwt {MASK}"),
    "bearer": ("Authorization: Bearer opaqueTokenValue123", "opaqueTokenValue123", f"Authorization: Bearer {MASK}"),
    "password in url": ("db postgres://app:hunter2pw@db.local:5432/app", "hunter2pw",
                        f"db postgres://app:{MASK}@db.local:5432/app"),
    "password assignment": ("DB_PASSWORD=correcthorse", "correcthorse", f"DB_PASSWORD={MASK}"),
    "quoted token": ('{"token": "tok_live_998877"}', "tok_live_998877", '{"token": "' + MASK + '"}'),
    "api_key yaml": ("api_key: 'yamlsecretvalue'", "yamlsecretvalue", f"api_key: '{MASK}'"),
    "client secret": ("client_secret = s3cr3t-client", "s3cr3t-client", f"client_secret = {MASK}"),
}


@pytest.fixture
def planted(tmp_path):
    (tmp_path / "app.log").write_text("".join(line + "\n" for line, _, _ in PLANTED.values()) + "plain line\n")
    return tmp_path


@pytest.mark.parametrize("tool,args", [
    ("read_file", {"path": "app.log"}),
    ("read_log", {"path": "app.log"}),
    ("search_files", {"root": ".", "pattern": ".", "regex": True}),
])
async def test_every_planted_secret_is_masked(planted, tool, args):
    tools = ToolRegistry(ToolsConfig(file_roots=[str(planted)], log_roots=[str(planted)]))
    call = await tools.run(tool, args, CTX)
    assert call.status == "success"
    for kind, (_, secret, _) in PLANTED.items():
        assert secret not in call.result, kind
    data = orjson.loads(call.result)          # still valid JSON
    text = data["text"] if "text" in data else "\n".join(m["text"] for m in data["matches"])
    lines = text.split("\n")
    for (kind, (_, _, expected)), line in zip(PLANTED.items(), lines):
        if expected is not None:
            assert line == expected, kind
    assert lines[-1] == "plain line"


def test_ordinary_text_is_left_alone():
    for text in ("password reset requested for bob", "token bucket refilled", "CPU 5% on host auth-1",
                 "GET /api/v1/keys 200", "http://example.com:8080/path", "secret: no"):
        assert redact(text) == text


def test_counters_named_like_secrets_are_left_alone():
    text = '{"max_tokens":1024,"tokens_used":12345,"auth_mode":"single","text":"token_count=99999 passwords: 3"}'
    assert redact(text) == text
    assert redact("x-auth-token: qwerty12 aws_secret_access_key=AKzz/abcd") == (
        f"x-auth-token: {MASK} aws_secret_access_key={MASK}")

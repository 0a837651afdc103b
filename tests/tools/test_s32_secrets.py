"""The processes tool never shows a process's arguments (review s32): a real child process whose argv[0]
carries a password, as `exec -a "tool --pw SECRET"` sets it."""
from __future__ import annotations

import shutil
import subprocess
import time

import orjson
import psutil
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.system import process_name

CTX = ToolContext("alice", "s_1")
SECRET = "Zq7xK9mW2pL4vN8r"


@pytest.fixture
def disguised_child(tmp_path):
    """sleep, copied under a name longer than the kernel keeps (15 characters), started with an argv[0]
    that holds a password; killed at the end."""
    exe = tmp_path / "dbbackup_runner_tool"
    shutil.copy(shutil.which("sleep"), exe)
    child = subprocess.Popen([f"dbbackup_runner_tool --pw {SECRET}", "900"], executable=str(exe))
    try:
        # Popen may return (vfork) before the exec has set up the new argv: wait until it shows
        proc, deadline = psutil.Process(child.pid), time.monotonic() + 10
        while not proc.cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.cmdline()[0] == f"dbbackup_runner_tool --pw {SECRET}"
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


async def test_processes_never_shows_the_arguments_in_argv0(disguised_child):
    tools = ToolRegistry(ToolsConfig(cpu_sample_s=0.05))
    call = await tools.run("processes", {"name": "dbbackup", "limit": 50}, CTX)
    assert call.status == "success", call.result
    assert SECRET not in call.result and "--pw" not in call.result
    rows = {p["pid"]: p for p in orjson.loads(call.result)["processes"]}
    assert rows[disguised_child.pid]["name"] == "dbbackup_runner_tool"
    # the name filter decides on the name shown: it never tells whether a guess is in the arguments
    call = await tools.run("processes", {"name": SECRET[:8], "limit": 50}, CTX)
    assert call.status == "success", call.result
    assert orjson.loads(call.result)["matched"] == 0


def test_process_name_keeps_names_without_arguments(disguised_child):
    assert process_name(psutil.Process(disguised_child.pid)) == "dbbackup_runner_tool"
    me = psutil.Process()
    assert process_name(me) == me.name()        # a name without arguments is as psutil gives it


# -- redaction false positives (review s32): the daemon shapes added that day masked ordinary log and tool
# text, so the model reported a "secret" that was none and lost the real value

from server.tools.secrets import (DIRECTIVE_WORDS, MASK, PLAIN_VALUES, STATUS_WORDS,  # noqa: E402
                                  LineRedactor, redact)

REVIEW_LOG = [   # the review's app.log and the other lines it found masked: every one comes back as it is
    "2026-11-27 10:00:01 INFO api: user alice requested reset_password alice",
    "2026-11-27 10:00:02 DEBUG auth: invalidated session_token cache",
    "2026-11-27 10:00:03 INFO redis: masterauth configured",
    "app.py:42:10:warning:unused-variable",
    "10:22:33:444:INFO",
    "[mail.example.com]:587 relay:deferred",
    "2026-11-27 10:00:04 WARN gateway: header X-Auth-Token missing",
    "user alice requested reset_password alice",
    "invalidated session_token cache",
    "redis: masterauth configured",
    "rootpw locked",
    "grpc_auth_token Bearer",
    "2001:4860:4860:0:8888 up",
    "time=12:30:45 pid:4:x:y:zzzz",
]
REAL = {   # real secrets in the same file: still masked (line, secret, line as shown)
    "requirepass": ("requirepass Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"requirepass {MASK}"),
    "keepalived": ("    auth_pass Kp4ss123", "Kp4ss123", f"    auth_pass {MASK}"),
    "pgpass": ("db.example.com:5432:appdb:appuser:Pg5pass99", "Pg5pass99", f"db.example.com:5432:appdb:appuser:{MASK}"),
    "sasl_passwd": ("[smtp.example.com]:587 mailer@example.com:Sasl5pw99", "Sasl5pw99",
                    f"[smtp.example.com]:587 mailer@example.com:{MASK}"),
}


@pytest.fixture
def review_log(tmp_path):
    lines = [line for line, _, _ in REAL.values()] + REVIEW_LOG
    (tmp_path / "app.log").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize("tool,args", [
    ("read_file", {"path": "app.log"}),
    ("read_log", {"path": "app.log", "lines": 100}),
    ("search_files", {"root": ".", "pattern": ".", "regex": True, "limit": 100}),
])
async def test_log_and_tool_text_comes_back_unmasked(review_log, tool, args):
    tools = ToolRegistry(ToolsConfig(file_roots=[str(review_log)], log_roots=[str(review_log)]))
    call = await tools.run(tool, args, CTX)
    assert call.status == "success", call.result
    data = orjson.loads(call.result)
    shown = data["text"].split("\n") if "text" in data else [m["text"] for m in data["matches"]]
    shown = [line for line in shown if line]
    assert shown == [expected for _, _, expected in REAL.values()] + REVIEW_LOG
    for kind, (_, secret, _) in REAL.items():
        assert secret not in call.result, kind


async def test_the_values_are_found_by_a_search(review_log):
    """search_files decides on the redacted line: a masked value was not found at all."""
    tools = ToolRegistry(ToolsConfig(file_roots=[str(review_log)]))
    call = await tools.run("search_files", {"root": ".", "pattern": "alice$|cache$|configured$|unused-variable$|"
                                            ":INFO$|deferred$|locked$|Bearer$", "regex": True}, CTX)
    assert call.status == "success", call.result
    assert len(orjson.loads(call.result)["matches"]) == 11


WORDS = [w for w in STATUS_WORDS + PLAIN_VALUES if len(w) >= 4]   # shorter values are never masked anyway


@pytest.mark.parametrize("word", WORDS + [w.upper() for w in WORDS] + [w.capitalize() for w in WORDS])
def test_a_status_or_plain_value_is_no_secret(word):
    """After a known directive (masterauth configured, rootpw locked) as after a config key (grpc_auth_token
    Bearer): a status or a plain value, whatever its case."""
    for line in [f"{d} {word}" for d in DIRECTIVE_WORDS] + [f"SMTP_PASSWORD {word}", f"  auth_pass {word};",
                                                             f"[smtp.example.com]:587 mailer:{word}"]:
        assert redact(line) == line
        body = orjson.dumps({"text": "x\n" + line + "\ny"}).decode()
        assert redact(body) == body


@pytest.mark.parametrize("line,shown", [
    ("SMTP_PASSWORD Xq9s8PLm2wKz", f"SMTP_PASSWORD {MASK}"),
    ("\tSMTP_PASSWORD Xq9s8PLm2wKz # ops", f"\tSMTP_PASSWORD {MASK} # ops"),
    ("- SMTP_PASSWORD Xq9s8PLm2wKz", f"- SMTP_PASSWORD {MASK}"),
    ("SetEnv SMTP_PASSWORD Xq9s8PLm2wKz", f"SetEnv SMTP_PASSWORD {MASK}"),
    ("export SMTP_PASSWORD Xq9s8PLm2wKz", f"export SMTP_PASSWORD {MASK}"),
    ("  reset_password \"Xq9s8PLm2wKz\"", f"  reset_password \"{MASK}\""),
    ("INFO: SMTP_PASSWORD Xq9s8PLm2wKz", None),
    ("set SMTP_PASSWORD Xq9s8PLm2wKz", None),
    ("user alice requested reset_password alice", None),
    ("user alice requested reset_password \"alice\"", None),
    ("say 'auth_pass Xq9s8PLm2wKz'", None),
    ("requested reset_password Xq9s8PLm2wKz;", None),
])
def test_a_config_key_is_a_directive_only_first_on_its_line(line, shown):
    shown = line if shown is None else shown
    assert redact(line) == shown
    for lines in ([line], ["x", line, "y"]):        # the JSON text: after a \n escape, after the opening quote
        for body in (orjson.dumps({"text": "\n".join(lines)}).decode(), orjson.dumps(lines).decode()):
            assert orjson.loads(redact(body)) == orjson.loads(body.replace(orjson.dumps(line).decode()[1:-1],
                                                                             orjson.dumps(shown).decode()[1:-1]))
    assert LineRedactor().lines(["x", line, "y"]) == ["x", shown, "y"]


@pytest.mark.parametrize("line,masked", [
    ("db.example.com:5432:appdb:appuser:Xq9s8PLm2wKz", True),
    ("localhost:*:*:postgres:Xq9s8PLm2wKz", True),
    ("10.1.2.3:5432:app:app:Xq9s8PLm2wKz", True),
    ("db.example.pl:5432:app:app:Xq9s8PLm2wKz", True),   # a host in a TLD that is also a file name ending
    ("db01:5432:orders:reporter:weekly", True),        # a .pgpass row: nothing tells it from one without its file
    ("db.example.com:5432:appdb:appuser:Xq9s8PLm2wKz more", False),    # not the whole row
    ("see db.example.com:5432:appdb:appuser:Xq9s8PLm2wKz", False),
    ("app.py:42:10:warning:unused-variable", False),    # a file name
    ("main.go:42:10:vet:shadowed", False),
    ("10:22:33:444:INFO", False),                      # a time
    ("12:30:45:100:start", False),
    ("worker:5432:jobs:INFO:Xq9s8PLm2wKz", False),     # a log level
    ("db01:5432:orders:reporter:locked", False),       # a status
    ("fe80:1:2:3:abcd", False),                        # part of an IPv6 address
    ("my_host:5432:db:user:Xq9s8PLm2wKz", False),      # not a host name
])
def test_pgpass_rows(line, masked):
    shown = line[:line.rindex(":") + 1] + MASK if masked else line
    assert redact(line) == shown
    assert LineRedactor().lines(["x", line, "y"]) == ["x", shown, "y"]
    body = orjson.dumps({"text": "x\n" + line + "\ny"}).decode()
    assert orjson.loads(redact(body))["text"] == "x\n" + shown + "\ny"


@pytest.mark.parametrize("line,masked", [
    ("[smtp.example.com]:587 mailer@example.com:Xq9s8PLm2wKz", True),
    ("[smtp.example.com] mailer:Xq9s8PLm2wKz", True),
    ("[10.0.0.5]:25 relay:Xq9s8PLm2wKz", True),
    ("[mail.example.com]:587 relay:deferred", False),   # a mail log: a status
    ("[mail.example.com]:587 notify:queued", False),
    ("[2024-11-27]:00 job:Xq9s8PLm2wKz", False),       # a date, not a host
    ("[WARN] worker:Xq9s8PLm2wKz", False),             # a log level, not a host
    ("[smtp.example.com]:587 mailer@example.com:Xq9s8PLm2wKz sent", False),   # not the whole row
    ("[smtp.example.com]:587 a/b:Xq9s8PLm2wKz", False),   # not a login
])
def test_sasl_passwd_rows(line, masked):
    shown = line[:line.rindex(":") + 1] + MASK if masked else line
    assert redact(line) == shown
    assert LineRedactor().lines(["x", line, "y"]) == ["x", shown, "y"]
    body = orjson.dumps({"text": "x\n" + line + "\ny"}).decode()
    assert orjson.loads(redact(body))["text"] == "x\n" + shown + "\ny"

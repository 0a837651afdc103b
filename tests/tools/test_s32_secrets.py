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
            time.sleep(0.01)       # poll interval of a condition with a deadline, not a synchronisation
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

from server.tools.secrets import (DIRECTIVE_STATUS_WORDS, DIRECTIVE_WORDS, MASK, PLAIN_VALUES,  # noqa: E402
                                  STATUS_WORDS, LineRedactor, redact)

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
    """After a config key (grpc_auth_token Bearer, csrf_token refreshed) and in a sasl_passwd row: a status
    or a plain value, whatever its case; after a known directive only its status phrasings (masterauth
    configured, rootpw locked: DIRECTIVE_STATUS_WORDS)."""
    lines = [f"SMTP_PASSWORD {word}", f"  auth_pass {word};", f"[smtp.example.com]:587 mailer:{word}"]
    if word.lower() in DIRECTIVE_STATUS_WORDS:
        lines += [f"{d} {word}" for d in DIRECTIVE_WORDS]
    for line in lines:
        assert redact(line) == line
        body = orjson.dumps({"text": "x\n" + line + "\ny"}).decode()
        assert redact(body) == body


# an empty literal (none, null, true, false) after a directive is no password whatever the directive
LITERALS = ("none", "null", "true", "false")
DIRECTIVE_PASSWORDS = [w for w in WORDS if w not in DIRECTIVE_STATUS_WORDS + LITERALS]


@pytest.mark.parametrize("word", DIRECTIVE_PASSWORDS + [w.capitalize() for w in DIRECTIVE_PASSWORDS])
def test_a_known_directive_masks_any_other_word(word):
    """Review s32, second round: requirepass, masterauth, bindpw, rootpw take a password, whatever word it is
    (requirepass Bearer, masterauth Token, bindpw changed); only the status phrasings daemons log stay."""
    for d in DIRECTIVE_WORDS:
        assert redact(f"{d} {word}") == f"{d} {MASK}"
        body = orjson.dumps({"text": f"x\n{d} {word}\ny"}).decode()
        assert orjson.loads(redact(body))["text"] == f"x\n{d} {MASK}\ny"
        assert LineRedactor().lines([f"{d} {word}"]) == [f"{d} {MASK}"]


@pytest.mark.parametrize("phrase", [*DIRECTIVE_STATUS_WORDS, "Configured", "LOCKED"])
def test_a_known_directive_keeps_its_status_phrasings(phrase):
    for d in DIRECTIVE_WORDS:
        line = f"redis: {d} {phrase}"
        assert redact(line) == line
        assert LineRedactor().lines([line]) == [line]


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
    # review s32, second round: a config line is still one after a Dockerfile's ENV / ARG, a comment leader, a
    # one-word label or a shell's && / ||; a log line (a log level, a time or two words before the key) is not
    ("ENV POSTGRES_PASSWORD hunter2xyz", f"ENV POSTGRES_PASSWORD {MASK}"),
    ("arg DB_PASSWORD Xq9s8PLm2wKz", f"arg DB_PASSWORD {MASK}"),
    ("# DB_PASSWORD Hunter2Old", f"# DB_PASSWORD {MASK}"),
    ("## DB_PASSWORD Hunter2Old", f"## DB_PASSWORD {MASK}"),
    ("  ; smtp_password OldS3cretPw", f"  ; smtp_password {MASK}"),
    ("#auth_pass Xq9s8PLm2wKz", f"#auth_pass {MASK}"),
    ("!auth_pass Xq9s8PLm2wKz", f"!auth_pass {MASK}"),
    ("//SMTP_PASSWORD Xq9s8PLm2wKz", f"//SMTP_PASSWORD {MASK}"),
    ("-- DB_PASSWORD Xq9s8PLm2wKz", f"-- DB_PASSWORD {MASK}"),
    ("# export SMTP_PASSWORD Xq9s8PLm2wKz", f"# export SMTP_PASSWORD {MASK}"),
    ("vrrp: auth_pass Xq9s8PLm2wKz", f"vrrp: auth_pass {MASK}"),
    ("1: auth_pass Xq9s8PLm2wKz", f"1: auth_pass {MASK}"),
    ("conf.d/keepalived.conf:12:    auth_pass Xq9s8PLm2wKz", f"conf.d/keepalived.conf:12:    auth_pass {MASK}"),
    ("app.ini:3: ;smtp_password OldS3cretPw", f"app.ini:3: ;smtp_password {MASK}"),
    ("RUN echo hi && DB_PASSWORD Xq9s8PLm2wKz", f"RUN echo hi && DB_PASSWORD {MASK}"),
    ("RUN a || export DB_PASSWORD Xq9s8PLm2wKz", f"RUN a || export DB_PASSWORD {MASK}"),
    ("vrrp auth_pass Xq9s8PLm2wKz", None),             # a word before the key, no label
    ("INFO: SMTP_PASSWORD Xq9s8PLm2wKz", None),        # a log level
    ("warning: auth_pass Xq9s8PLm2wKz", None),
    ("10:00:01: auth_pass Xq9s8PLm2wKz", None),        # a time
    ("10:00: auth_pass Xq9s8PLm2wKz", None),
    ("2026-11-27: auth_pass Xq9s8PLm2wKz", None),      # a date
    ("api: user alice requested reset_password alice", None),
    ("line 3: auth_pass Xq9s8PLm2wKz", None),          # two words
    ("# auth_pass is required", None),
    ("#auth_pass configured", None),
    ("--no-password mydb", None),                       # an option, not a -- comment
    ("a; reset_password alice", None),                  # a ; inside the line is no comment leader
    ("make && reset_password is required", None),
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


# review s32, second round: .pgpass and sasl_passwd rows that are not exactly the whole line (indented, with
# trailing blanks or a comment, quoted by line number) were left in clear: (line, the line as shown)
@pytest.mark.parametrize("line,shown", [
    ("  db.example.com:5432:app:alice:Secretpw1", f"  db.example.com:5432:app:alice:{MASK}"),
    ("\tdb.example.com:5432:app:alice:Secretpw1", f"\tdb.example.com:5432:app:alice:{MASK}"),
    ("db.example.com:5432:app:alice:Secretpw1   ", f"db.example.com:5432:app:alice:{MASK}   "),
    ("db.example.com:5432:app:alice:Secretpw1\t", f"db.example.com:5432:app:alice:{MASK}\t"),
    ("db.example.com:5432:app:alice:Secretpw1\r", f"db.example.com:5432:app:alice:{MASK}\r"),
    ("db.example.com:5432:app:alice:Secretpw1 # prod", f"db.example.com:5432:app:alice:{MASK} # prod"),
    ("*:5432:*:alice:hunter2xyz\t#prod \"main\"", f"*:5432:*:alice:{MASK}\t#prod \"main\""),
    ("line 3: db.example.com:5432:app:alice:Secretpw1", f"line 3: db.example.com:5432:app:alice:{MASK}"),
    ("db.example.com:5432:app:alice:Secret#pw1", f"db.example.com:5432:app:alice:{MASK}"),   # # in the password
    ("  [smtp.gmail.com]:587 me@gmail.com:hunter2xyz   ", f"  [smtp.gmail.com]:587 me@gmail.com:{MASK}   "),
    ("[smtp.gmail.com]:587 me@gmail.com:hunter2xyz # relay", f"[smtp.gmail.com]:587 me@gmail.com:{MASK} # relay"),
    ("line 12: [smtp.example.com]:587 mailer:Sasl5pw99", f"line 12: [smtp.example.com]:587 mailer:{MASK}"),
    # still left alone
    ("db.example.com:5432:app:alice:Secret#pw1 more", None),      # not the whole row: no part of it masked
    ("db.example.com:5432:app:alice:Secretpw1 more # x", None),
    ("see line 3: db.example.com:5432:app:alice:Secretpw1", None),
    ("line 3: app.py:42:10:warning:unused-variable", None),
    ("  app.py:42:10:warning:unused-variable  # noqa", None),
    ("  10:22:33:444:INFO # tick", None),
    ("fe80:1:2:3:abcd # link-local", None),
    ("db01:5432:orders:reporter:locked  # status", None),
    ("  [mail.example.com]:587 relay:deferred # retry", None),
    ("line 3: [WARN] worker:Xq9s8PLm2wKz", None),
])
def test_rows_with_blanks_comments_and_line_numbers(line, shown):
    shown = line if shown is None else shown
    assert redact(line) == shown
    assert LineRedactor().lines(["x", line, "y"]) == ["x", shown, "y"]
    body = orjson.dumps({"text": "x\n" + line + "\ny"}).decode()
    assert orjson.loads(redact(body))["text"] == "x\n" + shown + "\ny"


# -- the review's files, through a real server: what reaches the model

from protocol import MsgType  # noqa: E402
from server.app import Server  # noqa: E402
from server.config import ServerConfig  # noqa: E402
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec  # noqa: E402
from testkit.server import V3Client  # noqa: E402

REVIEW_FILES = {   # name -> (text, secrets that must not reach the model, lines it must see)
    "Dockerfile": ("FROM postgres:16\nENV POSTGRES_PASSWORD hunter2xyz\nARG DEPLOY_TOKEN ghx0abcdef12\n",
                   ["hunter2xyz", "ghx0abcdef12"],
                   ["FROM postgres:16", f"ENV POSTGRES_PASSWORD {MASK}", f"ARG DEPLOY_TOKEN {MASK}"]),
    "app.ini": ("[smtp]\n;smtp_password OldS3cretPw\n# DB_PASSWORD Hunter2Old\nINFO: SMTP_PASSWORD not set\n",
                ["OldS3cretPw", "Hunter2Old"],
                ["[smtp]", f";smtp_password {MASK}", f"# DB_PASSWORD {MASK}", "INFO: SMTP_PASSWORD not set"]),
    "pgpass.txt": ("  db.example.com:5432:app:alice:Secretpw1\ndb2.example.com:5432:app:bob:Secretpw2 \n"
                   "app.py:42:10:warning:unused-variable\n",
                   ["Secretpw1", "Secretpw2"],
                   [f"  db.example.com:5432:app:alice:{MASK}", f"db2.example.com:5432:app:bob:{MASK} ",
                    "app.py:42:10:warning:unused-variable"]),
    "redis.conf": ("requirepass Bearer\nmasterauth Token\n# redis: masterauth configured\n",
                   [],
                   [f"requirepass {MASK}", f"masterauth {MASK}", "# redis: masterauth configured"]),
}


async def test_the_review_files_reach_the_model_masked(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for name, (text, _, _) in REVIEW_FILES.items():
        (files / name).write_text(text)
    async with ScriptedLLM(model="m") as llm:
        cfg = ServerConfig.from_dict({
            "server": {"host": "127.0.0.1", "port": 0}, "storage": {"root": str(tmp_path / "history")},
            "llm": {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "retries": 0,
                    "models_from_endpoint": False},
            "tools": {"file_roots": [str(files)]}, "summarization": {"enabled": False}}, env={})
        srv = Server(cfg, memory="basic")
        host, port = await srv.start()
        try:
            c = await V3Client.connect((host, port))
            calls = [ToolCallSpec(f"c{i}", "read_file", orjson.dumps({"path": str(files / name)}).decode())
                     for i, name in enumerate(REVIEW_FILES)]
            llm.push(Reply.tools(*calls), Reply.text("done"))
            r = await c.call(MsgType.CHAT_TEXT, text="read these files")
            end = (await c.turn_events(r["turn_id"]))[-1]
            assert end.type == MsgType.TURN_END
            await c.close()
        finally:
            await srv.stop()
    results = {m["tool_call_id"]: m["content"] for m in llm.requests[-1].body["messages"] if m["role"] == "tool"}
    assert len(results) == len(REVIEW_FILES)
    for i, (name, (_, secrets, shown)) in enumerate(REVIEW_FILES.items()):
        for secret in secrets:
            assert secret not in results[f"c{i}"], name
        assert orjson.loads(results[f"c{i}"])["text"].split("\n")[:len(shown)] == shown, name

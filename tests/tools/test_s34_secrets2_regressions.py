"""Regressions of the s34 redaction shapes (review own2): speed and false positives.

- The line redactor's hint of a state that runs over lines (a YAML block value, a Kubernetes env entry's
  name line, a PuTTY key's Private-Lines: header) matched ``name:`` anywhere, so an ordinary log whose
  lines hold ``hostname:`` / ``username:`` took the slow line-by-line path (and the hint itself, a Python
  regex starting with a character class, cost ~13 ms a MiB): search_files on a 32 MiB log went from
  0.32 s to 1.04 s. The hint is now one RE2 pass, each state's start first on its line, as the patterns
  that start the states need (``secrets.state_may_start``).
- PHP's ``define()`` masked every ``*_KEY`` / ``*_SALT`` constant (CACHE_KEY 'user_profile', PRIMARY_KEY
  'id', WP_CACHE_KEY_SALT): only a secret name or WordPress's eight keys and salts are masked now, and
  WordPress's placeholder stays.
- redis MONITOR: the arguments after any argument named "auth" / "requirepass" were masked ("HSET"
  "user:42" "auth" "oauth2"): now only a command's credential, the command at the command position.
"""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import MsgType
from server.app import Server
from server.tools import secrets
from server.tools.secrets import MASK, LineRedactor, redact
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client, make_config


def _json_lines(lines: list[str]) -> bytes:
    return orjson.dumps(lines, option=orjson.OPT_INDENT_2)


def _shown(line: str) -> tuple[str, str]:
    """``line`` as the whole-result redaction shows it (inside a JSON result) and as the file tools do."""
    whole = orjson.loads(redact(orjson.dumps({"text": "x\n" + line + "\ny"}).decode()))["text"].split("\n")[1]
    return whole, LineRedactor().lines(["x", line, "y"])[1]


# -- 2. the state hint: ordinary lines never take the line-by-line path -------------------------------------

ORDINARY_BLOCKS = {
    "hostname/username": ["hostname: web1", "username: bob", "filename: /var/log/app.log", "uptime: 3 days"],
    "a log": [f"2026-11-27T10:00:{s:02d} INFO api request done username: bob status=200 path=/api/v1/items/{s}"
              for s in range(60)],
    "a json log": ['{"ts":"2026-11-27T10:00:01","level":"info","name":"api","msg":"request done"}'] * 20,
    "name further on": ["INFO name: password-reset-service started", "service name: api-token-rotator",
                        "x = a > b | c", "echo a: |"],
}


@pytest.mark.parametrize("kind", list(ORDINARY_BLOCKS))
def test_ordinary_blocks_take_no_line_path(kind, monkeypatch):
    """An ordinary block (hostname:, username:, "name": in JSON, name: after other words) is redacted from its
    candidate lines only: the per-line state machinery (``_in_block``) is never run."""
    lines = ORDINARY_BLOCKS[kind]
    calls = []
    real = LineRedactor._in_block

    def spy(self, line):
        calls.append(line)
        return real(self, line)

    monkeypatch.setattr(LineRedactor, "_in_block", spy)
    assert LineRedactor().lines(lines) == lines
    assert calls == []


STATE_STARTS = [
    ["- name: DB_PASSWORD", "  value: x"], ["        - name: STRIPE_SECRET"], ["\t- 'Name' : TOKEN"],
    ['  "name": "DB_PASS",'], ["NAME: X"], ["password: |", "  abc"], ["  \"db_password\":\t>-"],
    ["a", "Private-Lines: 2", "AAAB"], ["  Private-Lines: 1"], ["- key: |2"],
]
NO_STATE_STARTS = [
    ["hostname: a", "username: b"], ['{"name":"api"}'], ["INFO name: x"], ["my name: bob"], ["x: b |"],
    ["value: a | b"], ["Public-Lines: 2"], ["the Private-Lines: 3 header"], ["a > b"],
]


@pytest.mark.parametrize("lines", STATE_STARTS)
def test_the_hint_finds_where_a_state_starts(lines):
    assert secrets.state_may_start(_json_lines(lines))


@pytest.mark.parametrize("lines", NO_STATE_STARTS)
def test_the_hint_skips_ordinary_lines(lines):
    assert not secrets.state_may_start(_json_lines(lines))


FRAGMENTS = ["name", "NAME", "Name", "host", "user", ": ", ":", " ", "\t", "- ", "'", "\"", "|", ">", "-", "2",
             "Private-Lines", "DB_PASSWORD", "password", "value", "x", "\\", "中", "\u2028", "\x1c"]


_BLANKS = st.sampled_from(["", " ", "  ", "\t", " \t"])
# lines shaped like a state's start, with a part or two off: indentation, a YAML list's dash, a quote, a key
# (name, a secret key, Private-Lines, an ordinary one), blanks, a colon, blanks, a value or a block indicator
_KEY_LINES = st.tuples(_BLANKS, st.sampled_from(["", "- ", "-\t", "x "]), st.sampled_from(["", "'", "\""]),
                       st.sampled_from(["name", "NAME", "Name", "hostname", "password", "db_password", "Private-Lines",
                                        "value", "a b"]),
                       st.sampled_from(["", "'", "\""]), _BLANKS, st.sampled_from([":", ""]), _BLANKS,
                       st.sampled_from(["DB_PASSWORD", "app", "|", ">-", "|2", "2", "x |", ""])).map("".join)


@given(st.lists(st.one_of(_KEY_LINES, st.lists(st.sampled_from(FRAGMENTS), max_size=7).map("".join)),
                min_size=1, max_size=5))
def test_the_hint_is_a_superset_of_the_state_starts(lines):
    """Wherever a line starts a state (``_block_starts``), the hint says so; and redaction with the hint
    equals redaction down the line path for every block."""
    starts = False
    for line in lines:
        probe = LineRedactor()
        probe._block_starts(line)
        starts |= probe._block_indent is not None or probe._env_value_next or bool(probe._ppk_left)
    if starts:
        assert secrets.state_may_start(_json_lines(lines))
    fast = LineRedactor().lines(lines + ["  value: S3cretValue1", "  AAAB"])
    slow = LineRedactor()
    real = secrets.state_may_start
    try:
        secrets.state_may_start = lambda data: True        # every block down the line path
        assert slow.lines(lines + ["  value: S3cretValue1", "  AAAB"]) == fast
    finally:
        secrets.state_may_start = real


# -- 3. PHP define(): only secret names and WordPress's eight keys and salts --------------------------------

RANDOM_64 = "k8#Lq2!vX9@pZ4$wR7^tY1&uI3*oP5(aB6)cD8-eF0_gH2+jK4=mN6[qS8]tV0{xZ2}y"[:64]
DEFINE_STAYS = [
    "define('CACHE_KEY', 'user_profile');", "define('PRIMARY_KEY', 'id');", "define('SORT_KEY', 'created_at');",
    "define('WP_CACHE_KEY_SALT', 'mysite_');", "define( 'WP_CACHE_KEY_SALT', 'example.com:prod:' );",
    'define("CACHE_KEY", "user_profile_v2");', "define('FOREIGN_KEY', 'owner_id');",
    "define('AUTH_KEY',         'put your unique phrase here');",
    "define( 'NONCE_SALT',       'put your unique phrase here' );",
]
WORDPRESS_KEYS = ["AUTH_KEY", "SECURE_AUTH_KEY", "LOGGED_IN_KEY", "NONCE_KEY", "AUTH_SALT", "SECURE_AUTH_SALT",
                  "LOGGED_IN_SALT", "NONCE_SALT"]
DEFINE_MASKED = ([(f"define( '{name}', '{RANDOM_64}' );", f"define( '{name}', '{MASK}' );") for name in WORDPRESS_KEYS]
                 + [("define('API_KEY', 'ak_live_1234567890');", f"define('API_KEY', '{MASK}');"),
                    ('define("SECRET_KEY", "Zq81mPw0aaa");', f'define("SECRET_KEY", "{MASK}");'),
                    ("define('DB_PASSWORD', 'Hunter2RealSecret');", f"define('DB_PASSWORD', '{MASK}');"),
                    ("define('STRIPE_SECRET', 'whsec_abcdef12');", f"define('STRIPE_SECRET', '{MASK}');")])


@pytest.mark.parametrize("line", DEFINE_STAYS)
def test_ordinary_php_constants_stay(line):
    assert _shown(line) == (line, line)


@pytest.mark.parametrize("line, expected", DEFINE_MASKED)
def test_secret_php_constants_are_masked(line, expected):
    assert _shown(line) == (expected, expected)


# -- 4. redis MONITOR: a command's credential, the command at the command position ---------------------------

MONITOR_STAYS = [
    '1714000000.123 [0 127.0.0.1:5000] "HSET" "user:42" "auth" "oauth2"',
    '1714000000.124 [0 127.0.0.1:5000] "SET" "auth" "enabled-for-all"',
    '1714000000.125 [0 127.0.0.1:5000] "DEL" "requirepass" "notes"',
    '1714000000.126 [0 127.0.0.1:5000] "HGET" "auth" "user42"',
    '1714000000.127 [0 127.0.0.1:5000] "SET" "masterauth" "documented-in-wiki"',
    '1714000000.128 [0 127.0.0.1:5000] "RPUSH" "queue" "auth" "x" "AUTH" "y"',
    '1714000000.129 [0 127.0.0.1:5000] "CONFIG" "GET" "requirepass"',
    '1714000000.130 [0 127.0.0.1:5000] "MIGRATE" "h" "6379" "" "0" "5000" "KEYS" "auth" "k2"',
    '"GET" "auth:session:42"', '"AUTH" failed',
]
MONITOR_MASKED = [
    ('1714000000.125 [0 127.0.0.1:5000] "AUTH" "RealRedisPass1"', f'1714000000.125 [0 127.0.0.1:5000] "AUTH" "{MASK}"'),
    ('1714000000.1 [0 127.0.0.1:5000] "auth" "default" "R3disAclPa55x"',
     f'1714000000.1 [0 127.0.0.1:5000] "auth" "default" "{MASK}"'),
    ('1714000000.1 [3 unix:/run/redis.sock] "AUTH" "S0ck3tPass"', f'1714000000.1 [3 unix:/run/redis.sock] "AUTH" "{MASK}"'),
    ('"AUTH" "FirstOnLine9"', f'"AUTH" "{MASK}"'),
    ('1714000000.1 [0 10.0.0.5:4000] "HELLO" "3" "AUTH" "app" "H3lloPass" "SETNAME" "worker"',
     f'1714000000.1 [0 10.0.0.5:4000] "HELLO" "3" "AUTH" "app" "{MASK}" "SETNAME" "worker"'),
    ('1714000000.1 [0 10.0.0.5:4000] "CONFIG" "SET" "requirepass" "N3wR3disPass"',
     f'1714000000.1 [0 10.0.0.5:4000] "CONFIG" "SET" "requirepass" "{MASK}"'),
    ('1714000000.1 [0 10.0.0.5:4000] "config" "set" "maxmemory" "1gb" "masterauth" "Mast3rPass" "appendonly" "yes"',
     f'1714000000.1 [0 10.0.0.5:4000] "config" "set" "maxmemory" "1gb" "masterauth" "{MASK}" "appendonly" "yes"'),
    ('1714000000.1 [0 10.0.0.5:4000] "MIGRATE" "h" "6379" "" "0" "5000" "COPY" "AUTH" "M1gratePass" "KEYS" "a" "b"',
     f'1714000000.1 [0 10.0.0.5:4000] "MIGRATE" "h" "6379" "" "0" "5000" "COPY" "AUTH" "{MASK}" "KEYS" "a" "b"'),
    ('1714000000.1 [0 10.0.0.5:4000] "MIGRATE" "h" "6379" "k" "0" "5000" "AUTH2" "app" "M1gr2Pass"',
     f'1714000000.1 [0 10.0.0.5:4000] "MIGRATE" "h" "6379" "k" "0" "5000" "AUTH2" "app" "{MASK}"'),
]


@pytest.mark.parametrize("line", MONITOR_STAYS)
def test_redis_arguments_named_auth_stay(line):
    assert _shown(line) == (line, line)


@pytest.mark.parametrize("line, expected", MONITOR_MASKED)
def test_redis_credentials_are_masked(line, expected):
    assert _shown(line) == (expected, expected)


# -- over loopback: the reviewer's files read by a real server ----------------------------------------------

CONSTANTS = ("<?php\ndefine('CACHE_KEY', 'user_profile');\ndefine('PRIMARY_KEY', 'id');\n"
             "define('SORT_KEY', 'created_at');\ndefine('DB_PASSWORD', 'Hunter2RealSecret');\n")
MONITOR = ('1714000000.123 [0 127.0.0.1:5000] "HSET" "user:42" "auth" "oauth2"\n'
           '1714000000.124 [0 127.0.0.1:5000] "SET" "auth" "enabled-for-all"\n'
           '1714000000.125 [0 127.0.0.1:5000] "AUTH" "RealRedisPass1"\n')


async def test_a_real_server_shows_the_look_alikes_and_masks_the_secrets(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    (root / "constants.php").write_text(CONSTANTS)
    (root / "redis-monitor.log").write_text(MONITOR)
    async with ScriptedLLM() as llm:
        llm.push(Reply.tools(ToolCallSpec("c1", "read_file", '{"path": "constants.php"}'),
                             ToolCallSpec("c2", "read_log", '{"path": "redis-monitor.log"}'),
                             ToolCallSpec("c3", "search_files",
                                          orjson.dumps({"root": str(root), "pattern": "auth", "ignore_case": True}).decode())),
                 Reply.text("done"))
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "summarization": {"enabled": False}, "tools": {"file_roots": [str(root)], "log_roots": [str(root)]}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            reply = await c.call(MsgType.CHAT_TEXT, text="read them")
            events = await c.turn_events(reply["turn_id"], timeout=30)
            await c.close()
        finally:
            await srv.stop()
    assert events[-1].type == MsgType.TURN_END, events[-1].body
    calls = {ev.body["call"]["id"]: ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT}
    assert sorted(calls) == ["c1", "c2", "c3"] and all(c["status"] == "success" for c in calls.values())
    assert orjson.loads(calls["c1"]["result"])["text"] == CONSTANTS.replace("Hunter2RealSecret", MASK).rstrip("\n")
    assert orjson.loads(calls["c2"]["result"])["text"].rstrip("\n") == MONITOR.replace(
        "RealRedisPass1", MASK).rstrip("\n")
    matches = orjson.loads(calls["c3"]["result"])["matches"]
    assert [(m["line"], m["text"]) for m in matches if m["path"] == "redis-monitor.log"] == [
        (1, MONITOR.split("\n")[0]), (2, MONITOR.split("\n")[1]), (3, MONITOR.split("\n")[2].replace("RealRedisPass1", MASK))]
    sent = orjson.dumps([r.body for r in llm.requests]).decode()
    assert "Hunter2RealSecret" not in sent and "RealRedisPass1" not in sent

"""Secrets the file tools showed raw, and values they masked that are no secret (review-diff3:
leak_longline.py, leak_shapes.py, probe.py, probe2.py, fp_scan.py).

- search_files redacted a line longer than 1 MiB in pieces, each on its own: a ``"password": "X"`` cut
  in two was masked in neither (``grep Sup3r`` showed ``ord": "Sup3rSecretValue42"``). Such a line is
  now neither matched nor shown (``skipped.long_line``).
- a tab between a secret's name and its value (``password<TAB>=<TAB>X``: ``\\t`` in the JSON form);
- values with ``;``, a quote or a backslash (``password=ab;X``, ``"ab\\"X"``), SQL's
  ``WITH PASSWORD 'X'`` / ``IDENTIFIED BY 'X'``, and a known value inside a JSON file's string;
- over-masking: ``DSN_TIMEOUT=300000`` masked every 300000, ``PRIVATE_SUBNET`` every route; source code
  such as ``token = ns.token`` or ``token: str,``.
"""
from __future__ import annotations

import threading
import time

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from protocol import MsgType
from server.app import Server
from server.tools import ToolContext, ToolRegistry, ToolsConfig
from server.tools.search import BLOCK, MAX_LINE_BYTES
from server.tools.secrets import (_SECRET_KEY, _YAML_BLOCK_KEY, MASK, SECRET_SHAPES, LineRedactor, redact,
                                  redact_shapes, secret_values, sensitive_variable)
from testkit.server import V3Client, answer_text, make_config

CTX = ToolContext("alice", "s_1")
SECRET = "Sup3rSecretValue42"


async def search(tools: ToolRegistry, root: str, pattern: str) -> dict:
    call = await tools.run("search_files", {"root": root, "pattern": pattern}, CTX)
    assert call.status == "success", call.result
    return orjson.loads(call.result)


# -- 1. lines longer than MAX_LINE_BYTES ---------------------------------------------------------------

def _minified(size: int, at: int) -> str:
    """One JSON line of about ``size`` bytes whose password's value starts at byte ``at``."""
    head = '{"pad": "' + "x" * (at - len('{"pad": "') - len('", "password": "')) + '", "password": "'
    line = head + SECRET + '", "user": "app", "more": "'
    return line + "y" * (size - len(line) - 2) + '"}'


@pytest.mark.parametrize("size,at", [
    (2 * BLOCK + 70_000, 2 * BLOCK - 8),       # the review's file: the name before the 2 MiB mark, the value after
    (2 * BLOCK + 70_000, BLOCK + 5),
    (BLOCK + BLOCK // 2, BLOCK - 3),           # read whole in one region, still over the limit
])
async def test_a_line_too_long_to_search_is_never_matched_nor_shown(tmp_path, size, at):
    line = _minified(size, at)
    assert len(line) > MAX_LINE_BYTES and line.index(SECRET) == at
    (tmp_path / "config.json").write_text(f"first password line\n{line}\nlast {SECRET[:5]} password line\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)]))
    for pattern, lines in ((SECRET[:5], [3]), ("password", [1, 3]), ("app", []), (SECRET, [])):
        found = await search(tools, str(tmp_path), pattern)
        assert [m["line"] for m in found["matches"]] == lines, pattern
        assert found["skipped"] == {"long_line": 1}
        assert "Secret" not in str(found["matches"])


@pytest.mark.parametrize("mark_at", [BLOCK + 100, 2 * BLOCK - 5])   # in a piece; cut between two pieces
async def test_a_key_block_begun_in_a_skipped_line_stays_masked(tmp_path, mark_at):
    """The skipped line is not redacted: if it may open a key block, the lines after it are masked up
    to an END line (more masked, never less)."""
    begin = "-----BEGIN RSA PRIVATE KEY-----"
    line = "x" * (mark_at - len("-----BEGIN RSA ")) + begin + "z" * BLOCK
    assert line.index("PRIVATE KEY") == mark_at
    body = ["MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun", "VTLw7onLRnrq0/IzW7yWR7QkrmBL"]
    (tmp_path / "k.txt").write_text("\n".join([line, *body, "-----END RSA PRIVATE KEY-----", "port: 80 MII"]) + "\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)]))
    found = await search(tools, "k.txt", "MII")
    assert [(m["line"], m["text"]) for m in found["matches"]] == [(5, "port: 80 MII")]
    assert found["skipped"] == {"long_line": 1}
    assert [m["text"] for m in (await search(tools, "k.txt", "o"))["matches"]] == ["port: 80 MII"]


async def test_the_offline_agent_cannot_grep_a_secret_out_of_a_long_line(tmp_path):
    """leak_longline.py over the wire: "grep Sup3r in <dir>" and "grep password in <dir>" on a
    minified JSON line of 2.2 MB whose password sits across the 2 MiB mark."""
    root = tmp_path / "files"
    root.mkdir()
    (root / "config.json").write_text(_minified(2 * BLOCK + 70_000, 2 * BLOCK - 8) + "\n")
    cfg = make_config(tmp_path, sections={"llm": {}, "tools": {"file_roots": [str(root)]}})
    srv = Server(cfg)
    addr = await srv.start()
    try:
        client = await V3Client.connect(addr)
        for ask in (f"grep Sup3r in {root}", f"grep password in {root}"):
            reply = await client.call(MsgType.CHAT_TEXT, id=client.next_id(), text=ask)
            events = await client.turn_events(reply["turn_id"], timeout=30)
            assert events[-1].type == MsgType.TURN_END, events[-1].body
            [call] = [ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT]
            assert call["tool_name"] == "search_files" and call["status"] == "success", call
            result = orjson.loads(call["result"])
            assert result["matches"] == [] and result["skipped"] == {"long_line": 1}
            assert "Sup3rSecret" not in call["result"] and "Sup3rSecret" not in answer_text(events)
        await client.close()
    finally:
        await srv.stop()


# -- 2., 3. shapes: whitespace escapes, delimited values, SQL --------------------------------------------

# line -> the line as it must come back
MASKED = {
    "password\t=\tTabSecret111": f"password\t=\t{MASK}",
    "db_password:\tTabSecret222": f"db_password:\t{MASK}",
    "api_key =\x0bVtSecret333": f"api_key =\x0b{MASK}",
    "token:\r Cr1Secret444": f"token:\r {MASK}",
    "tool --password\tTabFlag555": f"tool --password\t{MASK}",
    "password=ab;SemiSecret333": f"password={MASK}",
    "password=p@ss;w0rd!xyz": f"password={MASK}",
    "password=a,b<c>d&e9": f"password={MASK}",
    "PASSWORD=hunter22, next": f"PASSWORD={MASK}, next",
    'password = C:\\pw\\Back1slash': f"password = {MASK}",
    '{"password": "ab\\"QuoteSecret444"}': f'{{"password": "{MASK}"}}',
    '{"password": "ab\\\\cd\\\\", "user": "bob1"}': f'{{"password": "{MASK}", "user": "bob1"}}',
    '{"password": "tail\\\\"}': f'{{"password": "{MASK}"}}',
    "DB_PASSWORD='hunter2 with space'": f"DB_PASSWORD='{MASK}'",
    "secret: 'it\\'s a Secret1' # note": f"secret: '{MASK}' # note",
    'client_secret = "say \\"hi\\" Secret2"': f'client_secret = "{MASK}"',
    "pwd=Odbc;Pw9": f"pwd={MASK}",
    "LOG:  statement: ALTER USER app WITH PASSWORD 'SqlSecret555';":
        f"LOG:  statement: ALTER USER app WITH PASSWORD '{MASK}';",
    "CREATE ROLE r WITH ENCRYPTED PASSWORD 'md5Sql666x';": f"CREATE ROLE r WITH ENCRYPTED PASSWORD '{MASK}';",
    "ALTER USER 'app'@'%' IDENTIFIED WITH mysql_native_password BY 'Sql7x';":
        f"ALTER USER 'app'@'%' IDENTIFIED WITH mysql_native_password BY '{MASK}';",
    "CREATE USER u IDENTIFIED BY 'Sq\\'l8x';": f"CREATE USER u IDENTIFIED BY '{MASK}';",
}

KEPT = [
    "token: str,", "def hash_token(token: str) -> str:", "token = ns.token", "api_key=llm.api_key or NO_KEY",
    "token = self.config.token", "return Client(host, token=cfg.token, tls=None)", "token = secrets.token_hex(16)",
    "api_key=env.get(config.api_key_env) or 'unused'", "token=None, tls=None", "password: null", "secret=true",
    "Configs print `api_key=<set>` instead", 'f"{self.budget} tokens of the {self.window}-token window"',
    '`"secret": 15`, is a count', "password=x; other=y", "password: \"abc\"", "user identified by email",
    "ALTER USER app WITH PASSWORD NULL;", "token_count=3", "max_tokens: 1024", "bypass: true",
]


@pytest.mark.parametrize("line", list(MASKED))
def test_delimited_values_and_escaped_whitespace_are_masked(line):
    expected = MASKED[line]
    assert LineRedactor().lines(["before", line, "after"]) == ["before", expected, "after"]
    result = orjson.dumps({"text": line}).decode()        # any tool result (JSON text)
    assert orjson.loads(redact(result))["text"] == expected
    shown = orjson.dumps({"text": expected}).decode()     # shown lines are redacted again as a result
    assert redact(shown) == shown


@pytest.mark.parametrize("line", KEPT)
def test_look_alikes_in_code_and_prose_stay(line):
    assert LineRedactor().lines([line]) == [line]
    result = orjson.dumps({"text": "x\n" + line}).decode()
    assert redact(result) == result


# -- known values ----------------------------------------------------------------------------------------

QUOTED = 'pa"ss\\wörd1'


def test_a_known_value_is_masked_raw_and_inside_a_json_string(monkeypatch):
    """probe2.py: MYSQL_PWD='pa"ss\\wörd1' was masked in a text file, not in a JSON file, where it is
    written "pa\\"ss\\\\wörd1"."""
    monkeypatch.setenv("MYSQL_PWD", QUOTED)
    in_json_file = orjson.dumps({"pwd_of_mysql": QUOTED}).decode()      # {"pwd_of_mysql":"pa\"ss\\wörd1"}
    lines = [f"x {QUOTED} y", in_json_file]
    shown = LineRedactor().lines(lines)
    assert shown == ["x [REDACTED] y", '{"pwd_of_mysql":"[REDACTED]"}']
    for line in lines:
        assert orjson.loads(redact(orjson.dumps({"t": line}).decode()))["t"] == shown[lines.index(line)]


# -- 4. environment values that are no secret ----------------------------------------------------------

HARMLESS_ENV = {"DSN_TIMEOUT": "300000", "PRIVATE_SUBNET": "10.20.0.0/16", "PASS_MAX_DAYS": "99999",
                "USE_PRIVATE_REGISTRY": "registry-mirror-1", "TOKENIZERS_PARALLELISM": "false",
                "KEYBOARD_LAYOUT": "us-intl-alt", "AUTHOR_NAME": "Jane Q. Example", "KEYCLOAK_URL":
                "https://sso.example.com/realms/ops", "GPG_KEY": "7169605F62C751356D054A26A821E680E5FA6305",
                "SSH_AUTH_SOCK": "/tmp/ssh-XXXXabcd/agent.1234", "API_KEY_TIMEOUT": "1.5:30:00",
                "AUTH_IPV6_NET": "fd00:1234::/64", "SERVICE_TOKEN_ENABLED": "disabled", "APP_PWD": "~/work"}
SENSITIVE_ENV = {"MYSQL_PWD": "EnvSecretValue99", "SMTP_PASS": "SmtpSecret42", "SENTRY_DSN":
                 "https://dsnkey42@o1.ingest.sentry.io/5", "SSH_PRIVATE": "private-blob-42",
                 "APP_TOKEN": "tok-abcdef-1", "KEYCLOAK_CLIENT_SECRET": "kc-secret-77", "DB_PASSWORD": "12345678a"}


def test_environment_values_are_masked_only_when_they_look_like_secrets(monkeypatch):
    for name, value in {**HARMLESS_ENV, **SENSITIVE_ENV}.items():
        monkeypatch.setenv(name, value)
    for name, value in HARMLESS_ENV.items():
        assert not sensitive_variable(name, value), name
    values = secret_values()
    assert set(SENSITIVE_ENV.values()) <= values and not set(HARMLESS_ENV.values()) & values
    lines = ["2026-01-01 retry after 300000 ms (timeout 300000)", "route 10.20.0.0/16 via private network",
             *HARMLESS_ENV.values()]
    assert LineRedactor().lines(lines) == lines
    assert LineRedactor().lines(list(SENSITIVE_ENV.values())) == [MASK] * len(SENSITIVE_ENV)


async def test_a_real_server_masks_the_shapes_and_not_its_plain_environment(tmp_path, monkeypatch):
    """leak_shapes.py over the wire: the server's environment holds DSN_TIMEOUT and PRIVATE_SUBNET; the
    offline agent reads a file with tab-aligned and quoted secrets and ordinary log lines."""
    for name, value in HARMLESS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MYSQL_PWD", QUOTED)
    root = tmp_path / "files"
    root.mkdir()
    plain = ["2026-01-01 retry after 300000 ms (timeout 300000)", "route 10.20.0.0/16 via private network"]
    secret_lines = {**MASKED, '{"mysql": "pa\\"ss\\\\wörd1"}': f'{{"mysql": "{MASK}"}}'}
    (root / "app.conf").write_text("\n".join([*secret_lines, *plain]) + "\n")
    cfg = make_config(tmp_path, sections={"llm": {}, "tools": {"file_roots": [str(root)]}})
    srv = Server(cfg)
    addr = await srv.start()
    try:
        client = await V3Client.connect(addr)
        reply = await client.call(MsgType.CHAT_TEXT, id=client.next_id(), text=f"查看 {root}/app.conf")
        events = await client.turn_events(reply["turn_id"], timeout=30)
        assert events[-1].type == MsgType.TURN_END, events[-1].body
        [call] = [ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT]
        assert call["tool_name"] == "read_file" and call["status"] == "success", call
        assert orjson.loads(call["result"])["text"].split("\n") == [*secret_lines.values(), *plain]
        for secret in ("TabSecret111", "TabSecret222", "SemiSecret333", "QuoteSecret444", "SqlSecret555", "wörd1"):
            assert secret not in call["result"] and secret not in answer_text(events)
        await client.close()
    finally:
        await srv.stop()


# -- the prefilter and the line redactor stay exact with the new shapes -------------------------------

FRAGMENTS = ["password", "=", ":", "\t", "\x0b", "\r", " ", ";", ",", ")", "<", ">", "&", "'", '"', "\\", '\\"',
             "\\\\", "ab", "Secret1", "None", "ns.", "token", "llm.api_key", "secrets.token_hex(", "<set>", "}-token ",
             "--password", "WITH PASSWORD '", "IDENTIFIED BY '", "identified with plugin by '", "pwd=", "/x",
             "\u00a0", "中文", "ı", "ſ", "\u212a", "{", "}", '"token": "', "Bearer "]


def _all_shapes(text: str) -> str:
    for pattern, repl in SECRET_SHAPES:
        text = pattern.sub(repl, text)
    return text


@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=10))
def test_the_prefilter_finds_every_changed_shape(parts):
    line = "".join(parts)
    for text in (line, orjson.dumps({"text": line}).decode(), orjson.dumps(line).decode()[1:-1]):
        assert redact_shapes(text) == _all_shapes(text)
    masked = redact(orjson.dumps({"text": line}).decode())
    assert isinstance(orjson.loads(masked)["text"], str)          # the mask keeps the JSON valid
    shown = orjson.loads(redact(orjson.dumps(line).decode()))
    assert LineRedactor().lines(["plain", line, "end"]) == ["plain", shown, "end"]


@given(st.lists(st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join), max_size=10))
def test_all_lines_at_once_equal_one_by_one(lines):
    # a secret key opening a YAML block value ("password: >") masks the lines after it: fed one by one
    # they are not masked (like the lines of a PEM key); test_yaml_block_values_under_secret_keys_are_masked
    assume(not any(_YAML_BLOCK_KEY.match(line) and _SECRET_KEY.search(_YAML_BLOCK_KEY.match(line).group(3))
                   for line in lines))
    expected = [LineRedactor([QUOTED]).lines([line])[0] for line in lines]
    out: list[list[str]] = []
    worker = threading.Thread(target=lambda: out.append(LineRedactor([QUOTED]).lines(lines)), daemon=True)
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive(), f"LineRedactor.lines did not end on {lines!r}"
    assert out[0] == expected


@pytest.mark.parametrize("text", ["password=" + ";" * 16000, "password=" + "a;" * 8000 + " x", "pass='" + "\\'" * 8000,
                                  'password="' + '\\"' * 8000, "password\t=\t" * 3000, "token=a." * 4000,
                                  "token=" + "ns." * 5000 + "(", "WITH PASSWORD '" * 2000,
                                  "identified with a by" * 2000, "--password\t" * 4000])
def test_the_changed_shapes_stay_fast_on_hostile_text(text):
    body = orjson.dumps({"text": text}).decode()
    start = time.perf_counter()
    redact(body)
    LineRedactor().lines([text])
    assert time.perf_counter() - start < 1.0

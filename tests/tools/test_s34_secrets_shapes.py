"""Secret formats that passed the redactor unmasked (review s34, t1.py) and the look-alikes that must stay.

WordPress ``define('DB_PASSWORD', '...')`` and its keys and salts; PostgreSQL ``ALTER USER app PASSWORD
'...'`` / ``CREATE ROLE bob LOGIN PASSWORD '...'``; MySQL ``SET PASSWORD FOR 'app'@'%' = '...'``;
Kubernetes env pairs (``- name: DB_PASSWORD`` then ``value: ...`` on the next line: a state the line
redactor carries from one line to the next); Spring ``<property name="password" value="..."/>``;
``keytool -storepass ... -keypass ...``; redis MONITOR's ``"AUTH" "..."``; ``Cookie:`` (every value) and
``Set-Cookie:`` (the cookie's value, not its attributes); HTTP Digest's ``response="..."``; token prefixes
``xapp-``, ``glrt-``, ``GR1348941``, ``shpat_``, ``dop_v1_``, SendGrid's ``SG.``, Vault's old ``s.`` tokens
(24 characters with a capital, a small letter and a digit); PuTTY ``Private-Lines:`` key bodies.
"""
from __future__ import annotations

import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import MsgType
from server.app import Server
from server.tools.secrets import MASK, SECRET_SHAPES, LineRedactor, redact, redact_shapes
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client, make_config

# kind -> (line, the secret part, the line as it must come back)
FORMATS = {
    "wordpress define": ("define( 'DB_PASSWORD', 'WpDbPa55word!' );", "WpDbPa55word!",
                         f"define( 'DB_PASSWORD', '{MASK}' );"),
    "wordpress auth key": ("define( 'AUTH_KEY', 'k8#Lq2!vX9@pZ4$wR7^tY1&uI3*oP5(a' );", "k8#Lq2!vX9",
                           f"define( 'AUTH_KEY', '{MASK}' );"),
    "wordpress salt": ("define('NONCE_SALT',   'z1!x2@c3#v4$');", "z1!x2@c3#v4$", f"define('NONCE_SALT',   '{MASK}');"),
    "wordpress logged-in key": ('define("LOGGED_IN_KEY", "Lk9;q\\"Pw");', 'Lk9;q\\"Pw',
                                f'define("LOGGED_IN_KEY", "{MASK}");'),
    "postgres alter user": ("LOG:  statement: ALTER USER app PASSWORD 'PgAlterPa55';", "PgAlterPa55",
                            f"LOG:  statement: ALTER USER app PASSWORD '{MASK}';"),
    "postgres create role": ("CREATE ROLE bob LOGIN PASSWORD 'PgCreatePa55' VALID UNTIL 'infinity';", "PgCreatePa55",
                             f"CREATE ROLE bob LOGIN PASSWORD '{MASK}' VALID UNTIL 'infinity';"),
    "postgres encrypted": ("alter role ops encrypted password 'md5abcdef0123';", "md5abcdef0123",
                           f"alter role ops encrypted password '{MASK}';"),
    "mysql set password for": ("SET PASSWORD FOR 'app'@'%' = 'MySetPa55word';", "MySetPa55word",
                               f"SET PASSWORD FOR 'app'@'%' = '{MASK}';"),
    "mysql set password()": ('SET PASSWORD = PASSWORD("MyOldFnPa55");', "MyOldFnPa55",
                             f'SET PASSWORD = PASSWORD("{MASK}");'),
    "k8s flow mapping": ("env: [{name: DB_PASS, value: K8sInlinePa55}]", "K8sInlinePa55",
                         f"env: [{{name: DB_PASS, value: {MASK}}}]"),
    "ecs json env": ('{"name": "STRIPE_SECRET", "value": "StripeJsonVal99"}', "StripeJsonVal99",
                     f'{{"name": "STRIPE_SECRET", "value": "{MASK}"}}'),
    "spring property": ('<property name="password" value="SpringXmlPa55"/>', "SpringXmlPa55",
                        f'<property name="password" value="{MASK}"/>'),
    "keytool": ("keytool -importkeystore -srcstorepass Ch4ngeMeStore -deststorepass D3stSt0re -keypass K3yPa55",
                "Ch4ngeMeStore", f"keytool -importkeystore -srcstorepass {MASK} -deststorepass {MASK} -keypass {MASK}"),
    "redis monitor auth": ('1715000000.123 [0 127.0.0.1:5555] "AUTH" "R3disMonitorPa55"', "R3disMonitorPa55",
                           f'1715000000.123 [0 127.0.0.1:5555] "AUTH" "{MASK}"'),
    "redis monitor acl auth": ('1715000000.124 [0 127.0.0.1:5555] "auth" "default" "R3disAclPa55x"', "R3disAclPa55x",
                               f'1715000000.124 [0 127.0.0.1:5555] "auth" "default" "{MASK}"'),
    "cookie": ("Cookie: sessionid=9f8e7d6c5b4a39281706f5e4d3c2b1a0; csrftoken=Zx81Kq0Pw9", "9f8e7d6c5b4a39281706",
               f"Cookie: sessionid={MASK}; csrftoken={MASK}"),
    "cookie any value": ("cookie: theme=dark", "dark", f"cookie: theme={MASK}"),
    "curl --cookie": ("curl --cookie 'sid=CurlCookieVal42' https://x", "CurlCookieVal42",
                      f"curl --cookie 'sid={MASK}' https://x"),
    "set-cookie": ("Set-Cookie: JSESSIONID=A1B2C3D4E5F60718293A4B5C6D7E8F90; Path=/; HttpOnly",
                   "A1B2C3D4E5F60718293A", f"Set-Cookie: JSESSIONID={MASK}; Path=/; HttpOnly"),
    "digest response": ('Authorization: Digest username="bob", realm="x", nonce="dcd98b", '
                        'response="6629fae49393a05397450978507c4ef1"', "6629fae49393a0539745",
                        f'Authorization: Digest username="bob", realm="x", nonce="dcd98b", response="{MASK}"'),
    "slack xapp": ("[slack_xapp] xapp-1-A0123456789-1234567890123-abcdef0123456789", "xapp-1-A0123",
                   f"[slack_xapp] {MASK}"),
    "gitlab runner": ("runner glrt-AbCdEfGhIjKlMnOpQrSt registered", "glrt-AbCd", f"runner {MASK} registered"),
    "gitlab registration": ("GR1348941AbCdEfGhIjKlMnOpQrSt", "GR1348941AbCd", MASK),
    "shopify": ("shpat_0123456789abcdef0123456789abcdef", "shpat_0123", MASK),
    "digitalocean": ("DO dop_v1_" + "0123456789abcdef" * 4, "dop_v1_0123", f"DO {MASK}"),
    "sendgrid": ("SG.AbCdEfGhIjKlMnOpQrStUv.WxYz0123456789AbCdEfGhIjKlMnOpQrStUvWxYz0", "SG.AbCd", MASK),
    "vault s. token": ("X-Vault-Token: s.AbCdEfGhIjKlMnOpQrStUv12", "s.AbCdEfGhIjKlMnOpQrStUv12",
                       f"X-Vault-Token: {MASK}"),
    "vault s. token alone": ("vault token is s.Hl2sKvR2iA7XzLpCFqHEWc47 now", "s.Hl2sKvR2iA7XzLpCFqHEWc47",
                             f"vault token is {MASK} now"),
}

NOT_SECRETS = [
    "Cookie: none", "3 cookies set", "Use SET PASSWORD to change it", "ALTER USER app RENAME TO bob",
    "CREATE USER app;", "CREATE ROLE bob LOGIN;", "ALTER USER app PASSWORD NULL;",
    "SET PASSWORD FOR app = PASSWORD(NULL)",
    "len = s.length", "x = s.toString()", "s.AbCdEfGhIjKlMnOpQrStUvWx", "s.abcdefghijklmnopqrstuvw1",
    "S.ABCDEFGHIJKLMNOPQRSTUV12", "define('WP_DEBUG', true);", "define( 'DB_NAME', 'wordpress' );",
    "define('DB_PASSWORD', getenv('DB_PASSWORD'));", 'Authorization: Digest username="bob", realm="x"',
    "digest response time 1234", '<property name="url" value="jdbc:mysql://db/app"/>',
    '1715000000.1 [0 127.0.0.1:1] "GET" "session:42"', '"AUTH" failed', "keytool -storepass:env STOREPASS -list",
    "keytool -list -keystore ks.jks", "glrt-short", "shpat_xyz", "Private-Lines: 3", "- name: app",
    "  value: plain", "name: DB_PASSWORD", "the SG.x.y thing", "xapp-1", "2024-05-01 INFO request served in 12 ms",
]

VALUE_FROM = "- name: DB_PASSWORD\n  valueFrom:\n    secretKeyRef:\n      name: db\n      key: password"
# several lines: (text, the secrets in it, the text as it must come back)
BLOCKS = {
    "k8s env pair": ("        - name: DB_PASSWORD\n          value: K8sEnvValuePa55\n"
                     "        - name: STRIPE_SECRET\n          value: \"StripeEnvValue99\"\n        - name: LOG_LEVEL\n"
                     "          value: debug",
                     ["K8sEnvValuePa55", "StripeEnvValue99"],
                     f"        - name: DB_PASSWORD\n          value: {MASK}\n"
                     f"        - name: STRIPE_SECRET\n          value: \"{MASK}\"\n        - name: LOG_LEVEL\n"
                     "          value: debug"),
    "k8s valueFrom stays": (VALUE_FROM, [], VALUE_FROM),
    "putty key": ("PuTTY-User-Key-File-3: ssh-rsa\nEncryption: none\nComment: ops\nPublic-Lines: 1\n"
                  "AAAAB3NzaC1yc2EAAAADAQABAAABAQ\nPrivate-Lines: 3\n"
                  "AAABAQCh4Bz6fYV+Uv8bq3Vx9n4vZk0lGf3Q6t1GkqWmP0cR9Yy0xQ\nAAABAQDx1PrivPart2xYzAbCd+/e\nAAAB==\n"
                  "Private-MAC: 0123abcd",
                  ["AAABAQCh4Bz6", "AAABAQDx1PrivPart2"],
                  "PuTTY-User-Key-File-3: ssh-rsa\nEncryption: none\nComment: ops\nPublic-Lines: 1\n"
                  f"AAAAB3NzaC1yc2EAAAADAQABAAABAQ\nPrivate-Lines: 3\n{MASK}\n{MASK}\n{MASK}\nPrivate-MAC: 0123abcd"),
    "putty key, then text": ("Private-Lines: 1\nAAAB\nHello world", [], f"Private-Lines: 1\n{MASK}\nHello world"),
}


@pytest.mark.parametrize("kind", list(FORMATS))
def test_the_formats_are_masked(kind):
    line, secret, expected = FORMATS[kind]
    in_json = orjson.dumps({"text": line}).decode()
    assert orjson.loads(redact(in_json))["text"] == expected          # a tool result is JSON text
    assert secret not in redact(in_json)
    assert LineRedactor().lines(["before", line, "after"]) == ["before", expected, "after"]
    shown = orjson.dumps({"text": expected}).decode()     # the file tools' lines are redacted again as a result
    assert redact(shown) == shown


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_look_alikes_are_left_alone(text):
    assert redact(text) == text
    in_json = orjson.dumps({"text": "x\n" + text}).decode()
    assert redact(in_json) == in_json
    assert LineRedactor().lines([text]) == [text]


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_blocks_over_several_lines(kind):
    text, secrets, expected = BLOCKS[kind]
    whole = redact(orjson.dumps({"text": text}).decode())
    assert orjson.loads(whole)["text"] == expected
    lines = text.split("\n")
    assert LineRedactor().lines(lines) == expected.split("\n")
    for split in range(1, len(lines)):     # fed in two parts (the tools read a file by blocks): the same
        parts = LineRedactor()
        assert parts.lines(lines[:split]) + parts.lines(lines[split:]) == expected.split("\n")
    for secret in secrets:
        assert secret not in whole
    shown = orjson.dumps({"text": expected}).decode()
    assert redact(shown) == shown


def test_the_env_value_state_ends_with_the_file():
    redactor = LineRedactor()
    assert redactor.lines(["- name: DB_PASSWORD"]) == ["- name: DB_PASSWORD"]
    redactor.restart()      # another file: its first line is no value of the last file's name
    assert redactor.lines(["value: plain-text"]) == ["value: plain-text"]


FRAGMENTS = ["define(", "'DB_PASSWORD', ", "'AUTH_KEY'", "'", "\"", "\\", "ALTER USER app ", "PASSWORD ",
             "CREATE ROLE b ", "SET PASSWORD FOR ", "'a'@'%'", " = ", "name: ", "DB_PASSWORD", "\n", "  value: ",
             "<property name=\"password\" ", "value=\"", "keytool ", "-storepass ", "\"AUTH\" ", "\"x\" ",
             "Cookie: ", "Set-Cookie: ", "a=b; ", "Digest ", "response=\"", "0123456789abcdef0123", "xapp-1-",
             "glrt-", "GR1348941", "shpat_", "dop_v1_", "SG.", "s.", "AbCdEfGhIjKlMnOpQrStUv12", "Private-Lines: 2",
             "AAAB", " ", "ı", "İ", "\u212a", "中文"]


def _all_shapes(text: str) -> str:
    for pattern, repl in SECRET_SHAPES:
        text = pattern.sub(repl, text)
    return text


@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8))
def test_the_prefilter_finds_every_new_shape(parts):
    """The RE2 prefilter stays a superset with the new shapes: redaction through it equals running every
    shape, on the text and on its JSON form."""
    line = "".join(parts)
    for text in (line, orjson.dumps({"text": line}).decode()):
        assert redact_shapes(text) == _all_shapes(text)


@pytest.mark.parametrize("text", ["define(" * 4000, "ALTER USER a " * 2000, "SET PASSWORD FOR " + "'" * 8000,
                                  "\"AUTH\" " * 4000, "Cookie: " + "a=b; " * 4000, "Digest " * 4000,
                                  "name: DB_PASSWORD\n" * 2000, "Private-Lines: 9\n" * 2000 + "AAAB\n" * 2000,
                                  "s." + "Ab1" * 5000, "SG." + "a" * 16000],
                         ids=["define", "alter-user", "set-password", "auth", "cookie", "digest", "k8s-name", "ppk",
                              "vault-s", "sendgrid"])
def test_the_new_shapes_stay_fast_on_hostile_text(text):
    body = orjson.dumps({"text": text}).decode()
    start = time.process_time()                    # (this process's CPU: no other process's load counts)
    redact(body)
    LineRedactor().lines(text.split("\n"))
    assert time.process_time() - start < 2.0


# -- over loopback: a real server, a scripted model reading the files with the tools ----------------------

FILES = {
    "web/wp-config.php": "<?php\ndefine( 'DB_NAME', 'wordpress' );\n" + FORMATS["wordpress define"][0] + "\n"
                         + FORMATS["wordpress auth key"][0] + "\n",
    "k8s/deploy.yaml": "spec:\n  containers:\n  - name: app\n    env:\n    - name: DB_PASSWORD\n"
                       "      value: K8sEnvValuePa55\n    - name: STRIPE_SECRET\n      value: \"StripeEnvValue99\"\n",
    "k8s/pg.log": "\n".join(FORMATS[k][0] for k in ("postgres alter user", "postgres create role",
                                                    "mysql set password for")) + "\n",
    "app/batch.txt": "\n".join(FORMATS[k][0] for k in FORMATS if not k.startswith(("wordpress", "postgres")))
                     + "\n" + BLOCKS["putty key"][0] + "\n",
}
SECRETS = ["WpDbPa55word!", "k8#Lq2!vX9", "K8sEnvValuePa55", "StripeEnvValue99", "PgAlterPa55", "PgCreatePa55",
           "MySetPa55word", "SpringXmlPa55", "Ch4ngeMeStore", "R3disMonitorPa55", "9f8e7d6c5b4a39281706",
           "A1B2C3D4E5F60718293A", "6629fae49393a0539745", "xapp-1-A0123", "glrt-AbCd", "shpat_0123", "dop_v1_0123",
           "SG.AbCd", "s.AbCdEfGh", "AAABAQCh4Bz6"]


async def test_a_real_server_masks_them_everywhere(tmp_path):
    """t1.py over the wire: read_file, read_log and search_files on files holding every format; no secret in
    the tool results (live), the history, the export nor the requests sent to the model."""
    root = tmp_path / "files"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    async with ScriptedLLM() as llm:
        llm.push(Reply.tools(ToolCallSpec("c1", "read_file", '{"path": "web/wp-config.php"}'),
                             ToolCallSpec("c2", "read_file", '{"path": "k8s/deploy.yaml"}'),
                             ToolCallSpec("c3", "read_log", '{"path": "k8s/pg.log"}'),
                             ToolCallSpec("c4", "read_file", '{"path": "app/batch.txt"}'),
                             ToolCallSpec("c5", "search_files",
                                          orjson.dumps({"root": str(root), "pattern": "a"}).decode())),
                 Reply.text("done"))
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "summarization": {"enabled": False}, "tools": {"file_roots": [str(root)], "log_roots": [str(root)]}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            reply = await c.call(MsgType.CHAT_TEXT, text="read the configs")
            events = await c.turn_events(reply["turn_id"], timeout=30)
            history = await c.call(MsgType.HISTORY_REQUEST)
            export = await c.call(MsgType.HISTORY_EXPORT, format="json")
            await c.close()
        finally:
            await srv.stop()
    assert events[-1].type == MsgType.TURN_END, events[-1].body
    calls = {ev.body["call"]["id"]: ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT}
    assert sorted(calls) == ["c1", "c2", "c3", "c4", "c5"] and all(c["status"] == "success" for c in calls.values())
    assert orjson.loads(calls["c2"]["result"])["text"].split("\n")[5] == f"      value: {MASK}"
    assert orjson.loads(calls["c1"]["result"])["text"].split("\n")[2] == FORMATS["wordpress define"][2]
    matches = orjson.loads(calls["c5"]["result"])["matches"]
    assert {"path": "k8s/deploy.yaml", "line": 8, "text": f'      value: "{MASK}"'} in matches
    live = orjson.dumps([c["result"] for c in calls.values()]).decode()
    sent = orjson.dumps([r.body for r in llm.requests]).decode()
    for name, blob in (("live", live), ("history", orjson.dumps(history).decode()),
                       ("export", export["content"]), ("sent to the model", sent)):
        leaks = [s for s in SECRETS if s in blob or s in blob.replace('\\"', '"')]
        assert not leaks, (name, leaks)

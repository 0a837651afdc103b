"""Credential forms and environment variables that came back in clear (review: repro_shapes.py,
bisect_redact.py, repro_env.py), and the look-alikes that must stay.

- command lines: ``--db-password X``, ``--admin-pass X``, ``docker login -p X``, ``ldapsearch -w X``,
  ``smbclient -U admin%X``, ``openssl enc -k X``, ``htpasswd -b FILE USER X``, ``rabbitmqctl add_user U X``,
  ``mysqladmin password X``, ``vault login X``;
- config text: ``<password>X</password>``, ``'password' => 'X'``, a DSN's user info
  (``SENTRY_DSN=https://KEY@host``), ``PRIVATE_TOKEN X``, the password of a URL up to its last @
  (``mysql://app:p@ss@db``);
- environment variables named ``MYSQL_PWD``, ``SMTP_PASS``, ``REDIS_PASS``, ``SENTRY_DSN``,
  ``BORG_PASSPHRASE``: their values are masked wherever they appear, as ``DB_PASSWORD``'s were.
"""
from __future__ import annotations

import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import MsgType
from server.app import Server
from server.tools import ToolContext
from server.tools.secrets import MASK, SECRET_SHAPES, LineRedactor, redact, redact_shapes, secret_values
from testkit.server import V3Client, answer_text, make_config

CTX = ToolContext("alice", "s_1")

# kind -> (line, the secret part, the line as it must come back)
FORMATS = {
    "--db-password": ("backup.sh --db-password Leak1flag", "Leak1flag", f"backup.sh --db-password {MASK}"),
    "--admin-pass": ("setup --admin-pass Leak17x --yes", "Leak17x", f"setup --admin-pass {MASK} --yes"),
    "--db_pwd": ("tool --db_pwd Leak18pw", "Leak18pw", f"tool --db_pwd {MASK}"),
    "docker login -p": ("docker login -u ci -p Leak2docker registry.example.com", "Leak2docker",
                        f"docker login -u ci -p {MASK} registry.example.com"),
    "podman login -p": ("podman login -pLeak2podman quay.io", "Leak2podman", f"podman login -p{MASK} quay.io"),
    "ldapsearch -w": ("ldapsearch -x -D cn=admin -w Leak3ldap -b dc=x", "Leak3ldap",
                      f"ldapsearch -x -D cn=admin -w {MASK} -b dc=x"),
    "smbclient -U": ("smbclient //fs/share -U admin%Leak4smb", "Leak4smb", f"smbclient //fs/share -U admin%{MASK}"),
    "smbclient domain user": ("smbclient //fs/s -U CORP\\admin%Leak4dom", "Leak4dom",
                              f"smbclient //fs/s -U CORP\\admin%{MASK}"),
    "xml element": ("<password>Leak5maven</password>", "Leak5maven", f"<password>{MASK}</password>"),
    "xml element with a prefix": ("  <db.password>Leak5&amp;x</db.password>", "Leak5&amp;x",
                                  f"  <db.password>{MASK}</db.password>"),
    "xml camel case": ('<apiKey>Leak5"quoted"</apiKey>', 'Leak5"quoted"', f"<apiKey>{MASK}</apiKey>"),
    "php arrow": ("'password' => 'Leak6php',", "Leak6php", f"'password' => '{MASK}',"),
    "ruby symbol arrow": (":password => \"Leak6rb\"", "Leak6rb", f':password => "{MASK}"'),
    "sentry dsn": ("SENTRY_DSN=https://Leak7abcdef0123@o1.ingest.sentry.io/5", "Leak7abcdef0123",
                   f"SENTRY_DSN=https://{MASK}@o1.ingest.sentry.io/5"),
    "dsn yaml": ("dsn: 'https://Leak7b:Leak7c@sentry.example.com/2'", "Leak7b",
                 f"dsn: 'https://{MASK}@sentry.example.com/2'"),
    "sentry key in a url": ("https://0123456789abcdef0123456789abcdef@o1.ingest.sentry.io/5",
                            "0123456789abcdef0123456789abcdef", f"https://{MASK}@o1.ingest.sentry.io/5"),
    "PRIVATE_TOKEN": ("PRIVATE_TOKEN Leak9abc", "Leak9abc", f"PRIVATE_TOKEN {MASK}"),
    "vault login": ("vault login Leak11s.abcdef", "Leak11s.abcdef", f"vault login {MASK}"),
    "vault login -no-print": ("vault login -no-print hvs.Leak11CAESIabcdefghijklmnopq", "Leak11CAESI",
                              f"vault login -no-print {MASK}"),
    "vault token": ("token hvs.CAESIJLeak12abcdefghijklmnop in use", "CAESIJLeak12", f"token {MASK} in use"),
    "htpasswd -b": ("htpasswd -b /etc/nginx/.htpasswd admin Leak12ht", "Leak12ht",
                    f"htpasswd -b /etc/nginx/.htpasswd admin {MASK}"),
    "htpasswd -bn": ("htpasswd -bn admin Leak13ht > out", "Leak13ht", f"htpasswd -bn admin {MASK} > out"),
    "htpasswd -bBC 10": ("htpasswd -bBC 10 users admin Leak13bc", "Leak13bc", f"htpasswd -bBC 10 users admin {MASK}"),
    "openssl -k": ("openssl enc -aes-256-cbc -k Leak14ossl -in a", "Leak14ossl",
                   f"openssl enc -aes-256-cbc -k {MASK} -in a"),
    "rabbitmqctl add_user": ("rabbitmqctl add_user app Leak15rmq", "Leak15rmq", f"rabbitmqctl add_user app {MASK}"),
    "rabbitmqctl change_password": ("rabbitmqctl change_password 'app' 'Leak15cp'", "Leak15cp",
                                    f"rabbitmqctl change_password 'app' '{MASK}'"),
    "mysqladmin password": ("mysqladmin -u root -p password Leak24x", "Leak24x",
                            f"mysqladmin -u root -p password {MASK}"),
    "url password to the last @": ("DB=mysql://app:p@ssLeak16@db/x", "ssLeak16", f"DB=mysql://app:{MASK}@db/x"),
}

NOT_SECRETS = [
    "docker login -u ci --password-stdin registry.example.com", "docker run -p 8080:80 nginx",
    "ldapsearch -x -W -D cn=admin", "openssl req -new -key server.key -out s.csr", "openssl enc -d -kfile pass.txt",
    "smbclient -L //fs -U admin", "<passwordPolicy>strict</passwordPolicy>", "<maxTokens>1024</maxTokens>",
    "<pass>ok</pass>", "'timeout' => 30,", "'password_reset' => true,", "'compass' => 'north'", "bypass => true",
    "ssh://git@github.com/x.git", "http://user@host/x", "see http://a.com and email me@x.com",
    "http://example.com:8080/a@b", "psql --no-password mydb", "--password-file /etc/pw", "--max-tokens 1024",
    "htpasswd -c /etc/nginx/.htpasswd admin", "htpasswd -D users admin", "vault login -method=github",
    "vault login -method=userpass username=ops", "Run vault login with your token", "rabbitmqctl list_users",
    "mysqladmin -u root -p status", "csrf_token refreshed", "the dsn is set", "dsn: mydb", "BYPASS_CACHE=1",
]


@pytest.mark.parametrize("kind", list(FORMATS))
def test_credential_forms_are_masked(kind):
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


SENSITIVE_ENV = {"MYSQL_PWD": "EnvSecretValue99", "SMTP_PASS": "SmtpSecret42", "REDIS_PASS": "RedisSecret42",
                 "SENTRY_DSN": "https://dsnkey42@o1.ingest.sentry.io/5", "BORG_PASSPHRASE": "borg-horse-42",
                 "SSH_PRIVATE": "private-blob-42", "app.db.pass": "DottedPass42", "DB-PWD": "DashPwd42",
                 "LDAP_PASSWD_QUOTED": 'q"uo\\te42'}
HARMLESS_ENV = {"BYPASS_CACHE": "bypass-value-1", "COMPASS_HOME": "/opt/compass", "PASSAGE_TEXT": "passage-value",
                "PWD": "/srv/app/current", "OLDPWD": "/srv/app/previous", "BACKUP_PWD": "/var/backups"}


def test_sensitive_environment_values_are_masked_by_name_parts(monkeypatch):
    for name, value in {**SENSITIVE_ENV, **HARMLESS_ENV}.items():
        monkeypatch.setenv(name, value)
    values = secret_values()
    assert set(SENSITIVE_ENV.values()) <= values
    assert not set(HARMLESS_ENV.values()) & values
    line = " ".join(SENSITIVE_ENV.values()) + " " + " ".join(HARMLESS_ENV.values())
    shown = orjson.loads(redact(orjson.dumps({"text": line}).decode()))["text"]
    assert shown == " ".join([MASK] * len(SENSITIVE_ENV)) + " " + " ".join(HARMLESS_ENV.values())
    assert LineRedactor().lines(["a", line]) == ["a", shown]


FRAGMENTS = ["--db-password ", "--admin-pass ", "--no-password ", "docker login ", " -p ", "-p", "ldapsearch ",
             " -w ", "smbclient ", " -U ", "admin%", "<password>", "</password>", "<apiKey>", "'password' => '",
             " => ", "SENTRY_DSN=", "dsn: ", "https://", "0123456789abcdef0123456789abcdef", "@", "PRIVATE_TOKEN ",
             "vault login ", "hvs.", "htpasswd ", "-bn ", "-b ", "-C 10 ", "openssl ", " -k ", "rabbitmqctl ",
             "add_user ", "mysqladmin ", "password ", "mysql://app:", "p@ss", "Leak42value", "_", "\\", "\"", "'",
             " ", "ı", "İ", "ſ", "\u212a", "中文", "a1B2c3D4e5F6g7H8i9J0"]


def _all_shapes(text: str) -> str:
    for pattern, repl in SECRET_SHAPES:
        text = pattern.sub(repl, text)
    return text


@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8))
def test_the_prefilter_finds_every_new_shape(parts):
    """The RE2 prefilter (server/tools/re2_filter.py) stays a superset with the new shapes: redaction
    through it equals running every shape, on the text and on its JSON form, and line by line."""
    line = "".join(parts)
    for text in (line, orjson.dumps({"text": line}).decode()):
        assert redact_shapes(text) == _all_shapes(text)
    shown = orjson.loads(redact(orjson.dumps(line).decode()))
    assert LineRedactor().lines(["plain", line, "end"]) == ["plain", shown, "end"]


@pytest.mark.parametrize("text", ["--" + "a-" * 8000, "--a_" * 4000, "docker login -p" * 2000, "ldap " * 4000,
                                  "htpasswd" + " -b 1" * 3000, "htpasswd -b" + " a" * 8000,
                                  "vault login" + " -x" * 5000,
                                  "smbclient -U " + "\\" * 8000, "a://u:" + "@" * 16000, "<password>" + "a" * 16000,
                                  "dsn=http://" * 1500, "rabbitmqctl add_user a" + " b" * 8000, "=>" * 8000])
def test_the_new_shapes_stay_fast_on_hostile_text(text):
    body = orjson.dumps({"text": text}).decode()
    start = time.perf_counter()
    redact(body)
    LineRedactor().lines([text])
    assert time.perf_counter() - start < 1.0


async def test_a_real_server_masks_them_in_what_it_reads(tmp_path, monkeypatch):
    """repro_shapes.py and repro_env.py over the wire: the server's own environment holds MYSQL_PWD and
    SMTP_PASS; the offline agent reads a file holding them and the credential forms."""
    monkeypatch.setenv("MYSQL_PWD", "EnvSecretValue99")
    monkeypatch.setenv("SMTP_PASS", "SmtpSecret42")
    root = tmp_path / "etc"
    root.mkdir()
    lines = [line for line, _, _ in FORMATS.values()] + ["mysql pwd EnvSecretValue99", "smtp SmtpSecret42"]
    (root / "shapes.txt").write_text("\n".join(lines) + "\n")
    cfg = make_config(tmp_path, sections={"llm": {}, "tools": {"file_roots": [str(root)], "log_roots": [str(root)]}})
    srv = Server(cfg)
    addr = await srv.start()
    try:
        client = await V3Client.connect(addr)
        for ask, tool in (("查看 shapes.txt 的内容", "read_file"), ("tail shapes.txt", "read_log")):
            reply = await client.call(MsgType.CHAT_TEXT, id=client.next_id(), text=ask)
            events = await client.turn_events(reply["turn_id"], timeout=30)
            assert events[-1].type == MsgType.TURN_END, events[-1].body
            [call] = [ev.body["call"] for ev in events if ev.type == MsgType.TOOL_RESULT]
            assert call["tool_name"] == tool and call["status"] == "success", call
            text = orjson.loads(call["result"])["text"]
            assert text.split("\n") == [expected for _, _, expected in FORMATS.values()] + [
                f"mysql pwd {MASK}", f"smtp {MASK}"]
            for secret in [secret for _, secret, _ in FORMATS.values()] + ["EnvSecretValue99", "SmtpSecret42"]:
                assert secret not in call["result"] and secret not in answer_text(events)
        await client.close()
    finally:
        await srv.stop()

"""Secret-shaped values are masked in every tool result: one planted value of each kind in a real file,
read back through read_file, read_log and search_files."""
from __future__ import annotations

import time

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
    "long bearer": ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz",
                    f"Authorization: Bearer {MASK}"),
    "basic": ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz", f"Authorization: Basic {MASK}"),
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


# Credential formats that came back in clear before (review t10): each line must lose its secret part and
# keep the rest. kind -> (line, the secret part, the line as it must come back)
FORMATS = {
    "docker auth": ('{"auths": {"registry.example.com": {"auth": "YWRtaW46UzNjcjN0UGFzc3dvcmQh"}}}',
                    "YWRtaW46UzNjcjN0UGFzc3dvcmQh",
                    '{"auths": {"registry.example.com": {"auth": "' + MASK + '"}}}'),
    "npmrc _auth": ("_auth=YWRtaW46c2VjcmV0MTIz", "YWRtaW46c2VjcmV0MTIz", f"_auth={MASK}"),
    "basic_auth yaml": ("basic_auth: admin:S3cretPass1", "S3cretPass1", f"basic_auth: {MASK}"),
    "kube client-key-data": ("    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlFb3dJQkFB",
                             "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlFb3dJQkFB",
                             f"    client-key-data: {MASK}"),
    "kube client-certificate-data": ("    client-certificate-data: QmFzZTY0Q2VydERhdGFIZXJl",
                                     "QmFzZTY0Q2VydERhdGFIZXJl", f"    client-certificate-data: {MASK}"),
    "base64 pem blob": ("blob LS0tLS1CRUdJTiBPUEVOU1NIIFBSSVZBVEUgS0VZLS0tLS0K end",
                        "LS0tLS1CRUdJTiBPUEVOU1NIIFBSSVZBVEUgS0VZLS0tLS0K", f"blob {MASK} end"),
    "db_pass yaml": ("db_pass: Hunter2Hunter2", "Hunter2Hunter2", f"db_pass: {MASK}"),
    "DB_PASS env": ("export DB_PASS=Hunter3Hunter3", "Hunter3Hunter3", f"export DB_PASS={MASK}"),
    "pass ini": ("pass = iniSecretValue", "iniSecretValue", f"pass = {MASK}"),
    "passphrase yaml": ("passphrase: correct-horse-battery", "correct-horse-battery", f"passphrase: {MASK}"),
    "key_passphrase json": ('{"key_passphrase": "staple-battery"}', "staple-battery",
                            '{"key_passphrase": "' + MASK + '"}'),
    "django SECRET_KEY": ("SECRET_KEY=django-insecure-9f8e7d", "django-insecure-9f8e7d", f"SECRET_KEY={MASK}"),
    "signing_key": ("signing_key: hmacSigningValue99", "hmacSigningValue99", f"signing_key: {MASK}"),
    "mysql -p": ("mysql -uroot -pS3cretPass! -h db", "S3cretPass!", f"mysql -uroot -p{MASK} -h db"),
    "mysqldump -p": ("mysqldump -u app -pDumpPass77 shop", "DumpPass77", f"mysqldump -u app -p{MASK} shop"),
    "--password value": ("psql-wrapper --password S3cretPass! --host db", "S3cretPass!",
                         f"psql-wrapper --password {MASK} --host db"),
    "--api-key value": ("deploy --api-key AbCdEf123456 --env prod", "AbCdEf123456",
                        f"deploy --api-key {MASK} --env prod"),
    "openssl -passin": ("openssl rsa -passin pass:OpenSslPw1 -in k", "OpenSslPw1",
                        f"openssl rsa -passin {MASK} -in k"),
    "sshpass -p": ("sshpass -p hunter22 ssh ops@h", "hunter22", f"sshpass -p {MASK} ssh ops@h"),
    "redis-cli -a": ("redis-cli -h cache -a RedisPw123 ping", "RedisPw123", f"redis-cli -h cache -a {MASK} ping"),
    "curl -u": ("curl -u admin:CurlPw123 https://x", "CurlPw123", f"curl -u admin:{MASK} https://x"),
    "netrc line": ("machine api.example.com login bob password NetrcPw9", "NetrcPw9",
                   f"machine api.example.com login bob password {MASK}"),
    "htpasswd apr1": ("admin:$apr1$Qx7f2u1b$8mH1kq0xkY2QfP9l3o4Zt/", "8mH1kq0xkY2QfP9l3o4Zt/", f"admin:{MASK}"),
    "htpasswd bcrypt": ("ops:$2y$10$abcdefghijklmnopqrstuvABCDEFGHIJKLMNOPQRSTUVWXYZ01234",
                        "abcdefghijklmnopqrstuvABCDEFGHIJKLMNOPQRSTUVWXYZ01234", f"ops:{MASK}"),
    "htpasswd sha": ("web:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "W6ph5Mm5Pz8GgiULbPgzG37mj9g=", f"web:{MASK}"),
    "shadow sha512": ("root:$6$saltsalt$Xy12AbCdEfGhIjKlMnOpQrStUv:19000:0:99999:7:::", "Xy12AbCdEfGhIjKlMnOpQrStUv",
                      f"root:{MASK}:19000:0:99999:7:::"),
    "pgp private key": ("-----BEGIN PGP PRIVATE KEY BLOCK-----\\nlQOYBGPGPSECRET\\n-----END PGP PRIVATE KEY BLOCK-----",
                        "lQOYBGPGPSECRET", MASK),
    "npm token": ("published with npm_abcdefghijklmnopqrstuvwxyz0123456789",
                  "npm_abcdefghijklmnopqrstuvwxyz0123456789", f"published with {MASK}"),
    "stripe key": ("stripe sk_live_abcdefghijklmnop1234", "sk_live_abcdefghijklmnop1234", f"stripe {MASK}"),
    "hugging face token": ("hf hf_abcdefghijklmnopqrstuvwxyzABCDEF", "hf_abcdefghijklmnopqrstuvwxyzABCDEF",
                           f"hf {MASK}"),
}

# already masked before: kept masked (regressions)
STILL_MASKED = {
    "docker identitytoken": ('{"identitytoken": "abcdef123456789"}', "abcdef123456789"),
    "kube token": ("    token: kubeTokenValue123", "kubeTokenValue123"),
    "--token value": ("vault login --token hvs.CAESIJabc123", "hvs.CAESIJabc123"),
    "pwd": ("Server=db;Uid=app;Pwd=OdbcPw1234;", "OdbcPw1234"),
    "passwd": ("passwd=abcdef12", "abcdef12"),
    "--password=": ("mysql --password=S3cretPass! x", "S3cretPass!"),
    "url credentials": ("https://deploy:UrlPw123@git.example.com/repo.git", "UrlPw123"),
    "npm authToken": ("//registry.npmjs.org/:_authToken=abcdef0123456789", "abcdef0123456789"),
    "quoted yaml key": ('"password": hunter22', "hunter22"),
}

# look-alikes that are not secrets: they come back unchanged
NOT_SECRETS = [
    "password policy: 12 chars", "token_budget = 200", "keyboard layout: us", "max_tokens: 1024",
    "bypass: true", "compass: north", "auth: required", "author: John Smith", "oauth: enabled",
    "auth_mode = token", "PWD=/home/ops", "OLDPWD=~/src", "sort_key: name", "primary_key: id",
    "docker run -u 1000:1000 img", "mkdir -p /var/lib/x", "ssh -p 2222 ops@host", "mysql -p -u root shop",
    "use --password to be prompted", "--token-file /etc/vault/token", "the fee is $5 per month",
    "passes: 12", "passphrase required on first use", "keyboard-interactive authentication",
    "user logged in with password; session renewed", "cert: /etc/ssl/server.crt",
    "token refreshed for user ops", "Token expired at noon", "Bearer authentication failed", "Basic usage: run it",
    "Basic concepts",
]


@pytest.mark.parametrize("kind", list(FORMATS))
def test_credential_formats_are_masked(kind):
    line, secret, expected = FORMATS[kind]
    assert redact(line) == expected
    assert secret not in redact(orjson.dumps({"text": line}).decode())


@pytest.mark.parametrize("kind", list(STILL_MASKED))
def test_formats_masked_before_stay_masked(kind):
    line, secret = STILL_MASKED[kind]
    out = redact(orjson.dumps({"text": line}).decode())
    assert secret not in out and MASK in out


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_look_alikes_are_left_alone(text):
    assert redact(text) == text
    assert redact(orjson.dumps({"text": "x\n" + text}).decode()) == orjson.dumps({"text": "x\n" + text}).decode()


@pytest.mark.parametrize("tool,args", [
    ("read_file", {"path": "deploy.txt"}),
    ("search_files", {"root": ".", "pattern": ".", "regex": True, "limit": 200}),
])
async def test_credential_formats_are_masked_in_file_tool_results(tmp_path, tool, args):
    """The same lines planted in one file (as the review did), read back through the tools: every
    secret is gone, the JSON stays valid, the look-alikes come back as they are."""
    lines = [line for line, _, _ in FORMATS.values()] + NOT_SECRETS
    (tmp_path / "deploy.txt").write_text("\n".join(lines) + "\n")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)]))
    call = await tools.run(tool, args, CTX)
    assert call.status == "success", call.result
    for kind, (_, secret, _) in FORMATS.items():
        assert secret not in call.result, kind
    data = orjson.loads(call.result)
    text = data["text"] if "text" in data else "\n".join(m["text"] for m in data["matches"])
    assert text.split("\n")[-len(NOT_SECRETS):] == NOT_SECRETS


def test_the_tools_own_counts_keep_their_json_valid():
    """A JSON key of a tool's own result with a number ("skipped": {"secret": 15}) is not a credential:
    masking it broke the JSON (search_files over a tree with 10+ secret files failed to parse)."""
    text = '{"skipped":{"secret":15,"hardlink":12345},"limits":{"token":1234},"hidden":{"password": 99999}}'
    assert redact(text) == text
    assert orjson.loads(redact(text))["skipped"]["secret"] == 15


@pytest.mark.parametrize("text", ["a-" * 8000, "a." * 8000, "mysql " * 3000, "auth=" * 3000, "curl -u " * 2000])
def test_redaction_stays_fast_on_hostile_text(text):
    """Long runs that made a pattern rescan from every letter (a-a-a-... took 5 s before: the name prefix of
    the assignments and the URL scheme were unbounded) take milliseconds."""
    body = orjson.dumps({"text": text}).decode()
    start = time.perf_counter()
    out = redact(body)
    assert time.perf_counter() - start < 1.0
    assert orjson.loads(out)["text"].startswith(text[:10])


# Daemon config formats that came back in clear before (review s32): kind -> (line, secret, line as shown)
DAEMON_FORMATS = {
    "redis requirepass": ("requirepass Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"requirepass {MASK}"),
    "redis masterauth": ("masterauth Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"masterauth {MASK}"),
    "redis default example": ("requirepass foobared", "foobared", f"requirepass {MASK}"),
    "keepalived auth_pass": ("        auth_pass Kp4ss123", "Kp4ss123", f"        auth_pass {MASK}"),
    "nslcd bindpw": ("bindpw Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"bindpw {MASK}"),
    "sssd authtok": ("ldap_default_authtok = Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"ldap_default_authtok = {MASK}"),
    "haproxy stats auth": ("    stats auth admin:Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"    stats auth admin:{MASK}"),
    "haproxy insecure-password": ("    user admin insecure-password Xq9s8PLm2wKz", "Xq9s8PLm2wKz",
                                  f"    user admin insecure-password {MASK}"),
    "bind secret": ('    secret "WnF4c2VjcmV0S2V5QmFzZTY0PQ==";', "WnF4c2VjcmV0S2V5QmFzZTY0PQ==",
                    f'    secret "{MASK}";'),
    "kickstart rootpw": ("rootpw --plaintext Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"rootpw --plaintext {MASK}"),
    "wpa_supplicant psk": ('    psk="Xq9s8PLm2wKz"', "Xq9s8PLm2wKz", f'    psk="{MASK}"'),
    "rails secret_key_base": ("  secret_key_base: 9f8e7d6c5b4a39281706", "9f8e7d6c5b4a39281706",
                              f"  secret_key_base: {MASK}"),
    "laravel APP_KEY": ("APP_KEY=base64:Xq9s8PLm2wKzXq9s8PLm2wKzXq9s8PLm2wKz=", "Xq9s8PLm2wKzXq9s8PLm2wKz",
                        f"APP_KEY={MASK}"),
    ".NET appSettings": ('<add key="DbPassword" value="Xq9s8PLm2wKz" />', "Xq9s8PLm2wKz",
                         f'<add key="DbPassword" value="{MASK}" />'),
    "java properties xml": ('<entry key="db.password">Xq9s8PLm2wKz</entry>', "Xq9s8PLm2wKz",
                            f'<entry key="db.password">{MASK}</entry>'),
    "slack webhook": ("url: https://hooks.slack.com/services/T0000000/B0000000/Xq9s8PLm2wKzXq9s8PLm",
                      "Xq9s8PLm2wKzXq9s8PLm", f"url: https://hooks.slack.com/services/{MASK}"),
    "discord webhook": ("https://discord.com/api/webhooks/123456789/AbCdEfGhIjKlMnOpQrSt_uv",
                        "AbCdEfGhIjKlMnOpQrSt_uv", f"https://discord.com/api/webhooks/123456789/{MASK}"),
    "space-separated env": ("SMTP_PASSWORD Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"SMTP_PASSWORD {MASK}"),
    "apache SetEnv": ("SetEnv DB_PASSWORD Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"SetEnv DB_PASSWORD {MASK}"),
    "directive with comment": ("requirepass Xq9s8PLm2wKz  # set by ops", "Xq9s8PLm2wKz",
                               f"requirepass {MASK}  # set by ops"),
    "pgpass": ("db.example.com:5432:appdb:appuser:Xq9s8PLm2wKz", "Xq9s8PLm2wKz",
               f"db.example.com:5432:appdb:appuser:{MASK}"),
    "pgpass wildcard port": ("localhost:*:*:postgres:Xq9s8PLm2wKz", "Xq9s8PLm2wKz",
                             f"localhost:*:*:postgres:{MASK}"),
    "postfix sasl_passwd": ("[smtp.example.com]:587 mailer@example.com:Xq9s8PLm2wKz", "Xq9s8PLm2wKz",
                            f"[smtp.example.com]:587 mailer@example.com:{MASK}"),
    # review s32 (false positives fixed): the true positives next to them stay masked
    "postfix IP relay, plain login": ("[10.0.0.5]:587 relayuser:Xq9s8PLm2wKz", "Xq9s8PLm2wKz",
                                      f"[10.0.0.5]:587 relayuser:{MASK}"),
    "pgpass all wildcards": ("*:*:*:*:Xq9s8PLm2wKz", "Xq9s8PLm2wKz", f"*:*:*:*:{MASK}"),
    "config key in a YAML list": ("  - auth_pass Kp4ss123", "Kp4ss123", f"  - auth_pass {MASK}"),
    "nginx fastcgi_param": ("fastcgi_param DB_PASSWORD Xq9s8PLm2wKz;", "Xq9s8PLm2wKz",
                            f"fastcgi_param DB_PASSWORD {MASK};"),
    "redis CONFIG SET": ("redis-cli CONFIG SET masterauth Xq9s8PLm2wKz", "Xq9s8PLm2wKz",
                         f"redis-cli CONFIG SET masterauth {MASK}"),
    "config key with a plain-looking password": ("SMTP_PASSWORD Xq9s8PLm2wKz_locked", "Xq9s8PLm2wKz_locked",
                                                 f"SMTP_PASSWORD {MASK}"),
    # review s32, second round: what the narrowing let through (a Dockerfile's ENV / ARG, a commented-out
    # config line, a label or a shell's && before the key, a known directive's word that is no status
    # phrasing, .pgpass and sasl_passwd rows indented, quoted by line number, with trailing blanks or a comment)
    "Dockerfile ENV": ("ENV POSTGRES_PASSWORD hunter2xyz", "hunter2xyz", f"ENV POSTGRES_PASSWORD {MASK}"),
    "Dockerfile ENV root": ("ENV MYSQL_ROOT_PASSWORD Xq9s8EnvRoot", "Xq9s8EnvRoot", f"ENV MYSQL_ROOT_PASSWORD {MASK}"),
    "Dockerfile ARG": ("ARG DB_PASSWORD Xq9s8ArgPw", "Xq9s8ArgPw", f"ARG DB_PASSWORD {MASK}"),
    "lower-case env": ("env DB_PASSWORD Xq9s8EnvLow", "Xq9s8EnvLow", f"env DB_PASSWORD {MASK}"),
    "commented-out #": ("# DB_PASSWORD Hunter2Old", "Hunter2Old", f"# DB_PASSWORD {MASK}"),
    "commented-out ;": (";smtp_password OldS3cretPw", "OldS3cretPw", f";smtp_password {MASK}"),
    "commented-out #, no space": ("  #auth_pass Xq9s8Hash1", "Xq9s8Hash1", f"  #auth_pass {MASK}"),
    "commented-out !": ("!auth_pass Xq9s8Bang1", "Xq9s8Bang1", f"!auth_pass {MASK}"),
    "commented-out //": ("//SMTP_PASSWORD Xq9s8Slash1", "Xq9s8Slash1", f"//SMTP_PASSWORD {MASK}"),
    "commented-out --": ("-- DB_PASSWORD Xq9s8Dash1", "Xq9s8Dash1", f"-- DB_PASSWORD {MASK}"),
    "config label": ("vrrp: auth_pass Xq9s8Vrrp1", "Xq9s8Vrrp1", f"vrrp: auth_pass {MASK}"),
    "grep -n label": ("conf.d/keepalived.conf:12:    auth_pass Xq9s8Grep1", "Xq9s8Grep1",
                      f"conf.d/keepalived.conf:12:    auth_pass {MASK}"),
    "shell &&": ("RUN echo hi && DB_PASSWORD Xq9s8Shell1", "Xq9s8Shell1", f"RUN echo hi && DB_PASSWORD {MASK}"),
    "requirepass Bearer": ("requirepass Bearer", "Bearer", f"requirepass {MASK}"),
    "masterauth Token": ("masterauth Token", "Token", f"masterauth {MASK}"),
    "bindpw changed": ("bindpw changed", "changed", f"bindpw {MASK}"),
    "pgpass indented": ("  db.example.com:5432:app:alice:Secretpw1", "Secretpw1",
                        f"  db.example.com:5432:app:alice:{MASK}"),
    "pgpass trailing blanks": ("db2.example.com:5432:app:bob:Secretpw2 \t", "Secretpw2",
                               f"db2.example.com:5432:app:bob:{MASK} \t"),
    "pgpass comment": ("*:5432:*:alice:Secretpw3 # prod", "Secretpw3", f"*:5432:*:alice:{MASK} # prod"),
    "pgpass by line number": ("line 3: db.example.com:5432:app:alice:Secretpw4", "Secretpw4",
                              f"line 3: db.example.com:5432:app:alice:{MASK}"),
    "sasl_passwd comment": ("  [smtp.gmail.com]:587 me@gmail.com:SaslPw1x # relay", "SaslPw1x",
                            f"  [smtp.gmail.com]:587 me@gmail.com:{MASK} # relay"),
    "sasl_passwd by line number": ("line 7: [smtp.example.com]:587 mailer:SaslPw2x", "SaslPw2x",
                                   f"line 7: [smtp.example.com]:587 mailer:{MASK}"),
}

# prose and look-alikes near the new shapes: left alone
DAEMON_NOT_SECRETS = [
    "password reset link sent", "reset your password now", "auth_pass is required by vrrp_instance",
    "requirepass must be set in redis.conf", "SMTP_PASSWORD not set", "csrf_token refreshed",
    "api_key missing", "access_token expired", "psql --no-password mydb", "stats auth enabled",
    "keep the secret safe", "Jan 12 10:30:45 host sshd[1]: ok", "fe80::1:2:3:4", "00:11:22:33:44:55",
    "root:x:0:0:root:/root:/bin/bash", "key: |", "sort_key: |", '<add key="PageSize" value="50" />',
    "https://hooks.example.com/services/abc", "MYSQL_ROOT_PASSWORD_FILE /run/secrets/x", "password: |",
    # review s32: log and tool text the new shapes masked (a config key's shape not first on its line, a
    # status after a known directive, .pgpass and sasl_passwd look-alikes)
    "user alice requested reset_password alice", "invalidated session_token cache",
    "2026-11-27 10:00:01 INFO api: user alice requested reset_password alice",
    "redis: masterauth configured", "masterauth configured", "rootpw locked", "rootpw Locked",
    "requirepass disabled", "grpc_auth_token Bearer", "SMTP_PASSWORD none", "api_token enabled",
    "vrrp auth_pass Vr4pw999", "app.py:42:10:warning:unused-variable", "src/app.py:42:10:W0612:unused",
    "app.py:42:10:W0612:unusedvar", "10:22:33:444:INFO", "db01:5432:orders:reporter:ERROR",
    "[mail.example.com]:587 relay:deferred", "[mail.example.com]:587 notify:queued",
    "[2024-11-27]:00 job:finished", "2001:4860:4860:0:8888 up", "2001:4860:4860:0:8888", "fe80:1:2:3:abcd",
    "time=12:30:45 pid:4:x:y:zzzz", "Error: rsync:873:backup:user:denied", "backup:22:srv:root:done",
    # review s32, second round: near the prefixes, comment leaders, labels and relaxed rows allowed back
    "INFO: auth_pass Vr4pw999", "Error: SMTP_PASSWORD Vr4pw999", "10:00:01: auth_pass Vr4pw999",
    "2026-11-27: auth_pass Vr4pw999", "api: user alice requested reset_password alice", "# auth_pass is required",
    "#auth_pass configured", "; smtp_password not set", "--no-password mydb", "ENV DB_PASSWORD_FILE /run/secrets/db",
    "ARG DB_PASSWORD", "make test && reset_password is required", "a; reset_password alice", "requirepass not set",
    "requirepass required", "bindpw Unlocked", "line 3: app.py:42:10:warning:unused-variable",
    "  10:22:33:444:INFO # x", "fe80:1:2:3:abcd # x", "[mail.example.com]:587 relay:deferred # x",
]


@pytest.mark.parametrize("kind", list(DAEMON_FORMATS))
def test_daemon_config_formats_are_masked(kind):
    line, secret, expected = DAEMON_FORMATS[kind]
    assert redact(line) == expected
    body = orjson.dumps({"text": "x\n" + line + "\ny"}).decode()
    out = redact(body)
    assert secret not in out and orjson.loads(out)["text"] == "x\n" + expected + "\ny"


@pytest.mark.parametrize("text", DAEMON_NOT_SECRETS)
def test_daemon_look_alikes_are_left_alone(text):
    assert redact(text) == text
    body = orjson.dumps({"text": "x\n" + text + "\ny"}).decode()
    assert redact(body) == body


YAML_FILE = """\
db:
  user: app
  password: |
    Xq9s8PLm2wKzMultiline

    SecondLineOfIt99
  host: db.local
tls:
  - name: web
    private_key: >-
      KeyLineOne
      KeyLineTwo
    sort_key: |
      plain block text
notes: |
  nothing secret here
"""
YAML_SHOWN = f"""\
db:
  user: app
  password: |
    {MASK}

    {MASK}
  host: db.local
tls:
  - name: web
    private_key: >-
      {MASK}
      {MASK}
    sort_key: |
      plain block text
notes: |
  nothing secret here
"""


def test_yaml_block_values_under_secret_keys_are_masked():
    """``password: |`` holds its value on the lines after it, indented deeper: those lines are masked, in
    the JSON text (redact) and line by line (the file tools); the lines after the block are not."""
    assert orjson.loads(redact(orjson.dumps({"text": YAML_FILE}).decode()))["text"] == YAML_SHOWN
    from server.tools.secrets import LineRedactor
    assert LineRedactor().lines(YAML_FILE.split("\n")) == YAML_SHOWN.split("\n")
    one_by_one = LineRedactor()        # fed in pieces, as search_files and read_file do: the state carries
    assert [one_by_one.lines([line])[0] for line in YAML_FILE.split("\n")] == YAML_SHOWN.split("\n")


@pytest.mark.parametrize("tool,args", [
    ("read_file", {"path": "daemon.conf"}),
    ("search_files", {"root": ".", "pattern": ".", "regex": True, "limit": 200}),
    ("search_files", {"root": ".", "pattern": "Xq9s8|SecondLineOfIt|KeyLine|foobared|Kp4ss|W=|9f8e7d|hunter2|"
                                              "Hunter2Old|OldS3cretPw|Secretpw|SaslPw", "regex": True}),
])
async def test_daemon_formats_are_masked_in_file_tool_results(tmp_path, tool, args):
    """The daemon formats and the YAML file planted in real files, read back through the tools (over the
    redacted lines a search for the secret itself finds nothing)."""
    lines = [line for line, _, _ in DAEMON_FORMATS.values()] + DAEMON_NOT_SECRETS
    (tmp_path / "daemon.conf").write_text("\n".join(lines) + "\n")
    (tmp_path / "app.yaml").write_text(YAML_FILE)
    tools = ToolRegistry(ToolsConfig(file_roots=[str(tmp_path)]))
    call = await tools.run(tool, args, CTX)
    assert call.status == "success", call.result
    data = orjson.loads(call.result)
    shown_text = orjson.dumps(data.get("text") or data.get("matches")).decode()   # not the pattern echoed
    expected = [e for _, _, e in DAEMON_FORMATS.values()] + DAEMON_NOT_SECRETS
    for kind, (_, secret, _) in DAEMON_FORMATS.items():
        if not any(secret in e for e in expected):    # (a word such as Bearer is also in the look-alikes)
            assert secret not in shown_text, kind
    for secret in ("Xq9s8PLm2wKzMultiline", "SecondLineOfIt99", "KeyLineOne", "KeyLineTwo"):
        assert secret not in shown_text
    if tool == "read_file":
        assert data["text"].split("\n") == expected
    elif args["pattern"] == ".":
        shown = {(m["path"], m["line"]): m["text"] for m in data["matches"]}
        yaml_shown = YAML_SHOWN.split("\n")
        for (path, no), text in shown.items():
            if path.endswith("app.yaml"):
                assert text == yaml_shown[no - 1]
        assert [text for (path, _), text in sorted(shown.items()) if path.endswith("daemon.conf")] == expected
    else:
        assert data["matches"] == []


@pytest.mark.parametrize("text", ["auth_pass " * 4000, "requirepass --x " * 3000, "rootpw" + " --x" * 5000,
                                  'key="a_password" value="' * 2000, "h:1:d:u:" * 4000, "password: |\n " * 3000,
                                  "[a]:1 " * 4000, "stats auth " * 3000, "a" + "_a" * 8000 + "_password x",
                                  'secret "' * 3000, "--password\t" * 4000, "SMTP_PASSWORD " + "x" * 50000 + " y",
                                  # review s32, second round: the row and config-line starts and ends allowed back
                                  " " * 20000 + "db:5432:a:b:Xq9s8PLm2wKz" + " " * 20000 + "x",
                                  "db:5432:a:b:Xq9s8PLm2wKz #" + "x\\" * 20000, "vrrp:" + " " * 40000 + "x",
                                  "&& " * 8000 + "auth_pass", "#" * 20000 + " auth_pass x", "line 1: " * 5000,
                                  "a:1: " * 8000 + "auth_pass x", "ENV " * 8000 + "DB_PASSWORD x",
                                  "[h]:1 u:Xq9s8PLm2wKz" + "\t" * 30000 + "#"])
def test_daemon_shapes_stay_fast_on_hostile_text(text):
    from server.tools.secrets import LineRedactor
    body = orjson.dumps({"text": text}).decode()
    start = time.perf_counter()
    redact(body)
    LineRedactor().lines(text.split("\n"))
    assert time.perf_counter() - start < 1.0

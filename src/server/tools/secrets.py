"""Defence in depth: scrub secret values (API keys, tokens, passwords) out of tool output.

The tools never read environment variables or config values, but a log file or a process could
still echo one. Every result passes through ``redact`` before it reaches the model or a client:
first the known values (sensitive environment variables, ``sensitive_variable``: MYSQL_PWD,
SMTP_PASS, SENTRY_DSN too, when their value looks like a secret; the configured API key; as they are,
in their JSON form and JSON-escaped twice), then anything shaped like a
secret (``SECRET_SHAPES``): provider API keys (``sk-...``, ``AKIA...``, ``ghp_...``, ``xox?-...``,
``AIza...``, ``glpat-...``, ``glrt-...`` and GitLab's other token prefixes, ``GR1348941...``, ``npm_...``,
``pypi-...``, ``hf_...``, ``sk_live_...``, ``xapp-...``, ``shpat_...``, ``dop_v1_...``, SendGrid's ``SG.x.y``,
Vault's ``hvs.`` and older ``s.`` tokens: 24 letters and digits with a capital, a small letter and a digit), JWTs, ``Bearer``/``Token`` credentials (a word holding a digit, or long: not "token
refreshed"), ``Basic`` credentials (base64 of ``user:password``), the password of a URL
(``scheme://user:PASSWORD@host``, up to the last @ before the host), PEM private-key blocks and
base64-encoded PEM blobs (kubeconfig's ``client-key-data``), password hashes (``$apr1$...``,
``$6$...``, ``$2y$...``, ``{SHA}...``: htpasswd, shadow), the value of ``password=``,
``db_pass:``, ``passphrase:``, ``token: ``, ``api_key=``, ``secret=``, ``SECRET_KEY=``, ``APP_KEY=``,
``secret_key_base:``, ``psk=``, ``ldap_default_authtok =``, ``client-key-data:`` style assignments (JSON,
YAML, INI, env, PHP/Ruby ``=>``) and XML elements (``<password>...</password>``), of a DSN's user info, of a
credential-looking ``"auth": "..."`` (docker's config.json, .npmrc), and of command-line passwords
(``--password S3cret``, ``--db-password S3cret``, ``mysql -pS3cret``, ``curl -u user:S3cret``, ``redis-cli -a S3cret``,
``docker login -p``, ``ldapsearch -w``, ``smbclient -U user%S3cret``, ``openssl -k``,
``htpasswd -b``, ``rabbitmqctl add_user``, ``vault login``, netrc's ``login u password S3cret``)
and SQL's ``WITH PASSWORD 'X'`` / ``IDENTIFIED BY 'X'`` / ``CREATE|ALTER USER|ROLE ... PASSWORD 'X'`` / MySQL's
``SET PASSWORD [FOR u] = 'X'``; PHP's ``define('DB_PASSWORD', 'X')`` (a secret name, or one of WordPress's eight keys
and salts, ``WORDPRESS_KEYS``: not CACHE_KEY or WP_CACHE_KEY_SALT), keytool's ``-storepass X`` / ``-keypass X``, redis
MONITOR's ``"AUTH" [user] "X"``, ``"HELLO" "3" "AUTH" user "X"``, ``"MIGRATE" ... "AUTH" "X"`` and ``"CONFIG" "SET"
"requirepass" "X"`` (the command first after the line's ``[db addr]`` or first on its line: ``"HSET" "k" "auth"
"v"`` stays), every value of a ``Cookie:`` header
(and curl's ``--cookie``) and the cookie's value of a ``Set-Cookie:`` header, HTTP Digest's ``response="X"``,
Kubernetes env pairs (``name: DB_PASSWORD`` then ``value: X``, on the next line or in one flow mapping), the
lines of a PuTTY key's ``Private-Lines: N`` block, Spring's ``<property name="password" value="X"/>``; daemon
directives, the value alone at the end of
its line (redis ``requirepass X`` / ``masterauth X``, nslcd ``bindpw X``, kickstart ``rootpw --plaintext X``,
HAProxy ``insecure-password X``, BIND ``secret "X";``, and a config key ending with a secret word first on
its line: keepalived ``auth_pass X``, ``SMTP_PASSWORD X``, ``SetEnv DB_PASSWORD X``, ``ENV DB_PASSWORD X``,
commented out ``# DB_PASSWORD X`` / ``;auth_pass X`` / ``//X_PASSWORD X`` / ``!auth_pass X`` / ``-- X``, after a
one-word label ``vrrp: auth_pass X`` or a shell's ``&& DB_PASSWORD X``), HAProxy's ``stats auth user:X``, a
.pgpass row (``host:port:db:user:X``, the whole row, maybe indented, quoted as ``line N:``, with trailing
blanks or a `` # comment``), postfix's sasl_passwd row (``[host]:port user:X``, the same), key/value XML (``<add
key="DbPassword" value="X"/>``, ``<entry key="db.password">X</entry>``), the lines of a YAML block value under a
secret key (``password: |``), and the path of Slack and Discord webhook URLs. An assigned value runs as its format
delimits it: a quoted one to its closing quote (escaped quotes included), an unquoted one to whitespace (a tab
too). The result is JSON text, so a mask always covers whole escapes (``\\"``, ``\\t``) and never
a quote of the JSON itself: the mask keeps the JSON valid.

The file tools (read_file, read_log, search_files) show a file's lines redacted one by one
(``LineRedactor``), so what they count, cut and match is what the user sees: a pattern of
search_files decides on the redacted line, and a PEM private-key block is masked line by line, also
when only its middle lines are read or matched. States that run from one line to the next are carried the
same way: a YAML block value under a secret key, the value line after a Kubernetes env entry's secret name,
the N lines after a PuTTY key's ``Private-Lines: N``; they are followed through every line only when one of
them may start among the lines (``state_may_start``: one RE2 pass, the start first on its line, so hostname: or
username: in a log never cost the slow path). A fast RE2 prefilter, derived from ``SECRET_SHAPES`` so that it
matches wherever one of them can, picks the few lines to redact.

False positives are kept down by requiring an assignment (``name: value``) whose name *ends* with
the secret word: ``max_tokens: 1024``, ``token_budget = 200``, ``bypass: true``, ``auth_mode``,
"password policy: 12 chars" and "keyboard" stay as they are; so do code that reads a credential
(``token = ns.token``, ``token: str,``, ``token=None``) and placeholders (``api_key=<set>``). A directive
needs a known name or a config key's (a secret word after ``_ . -``, not an option's: ``--no-password
mydb`` stays), one word after it and nothing more on the line, a config key on a config line (first on its
line, or after a prefix, comment leader, label or && allowed above: a log line's "user alice requested
reset_password alice", "INFO: SMTP_PASSWORD X", "10:00:01: auth_pass X" stay), and a value that does not read
as a status: after a config key not a status or a plain value (``STATUS_WORDS``, ``PLAIN_VALUES``, a lower-case
word ending in -ed or -ing: "auth_pass is required", "csrf_token refreshed", "grpc_auth_token Bearer" stay),
after a known directive not one of its status phrasings (``DIRECTIVE_STATUS_WORDS``: "masterauth configured",
"rootpw locked" stay, "requirepass Bearer", "bindpw changed" are masked). A .pgpass row needs a host (not a
file name, a number or a time: "app.py:42:10:warning:unused-variable", "10:22:33:444:INFO" stay), no log level
among its fields and not to be part of an IPv6 address; a sasl_passwd row a host name or IP address, a login,
and a password that is not a status ("[mail.example.com]:587 relay:deferred" stays).
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from typing import Callable, Iterable
from urllib.parse import quote, quote_plus

import orjson
import re2

from server.tools.re2_filter import PatternFilter

# a variable name holding one of these words (not KEYBOARD, KEYCLOAK, TOKENIZERS or AUTHOR)
_SENSITIVE_NAME = re.compile(r"KEY(?!BOARD|CLOAK)|SECRET|TOKEN(?!IZ)|PASSW|PASSPHRASE|CREDENTIAL|AUTH(?!OR)",
                             re.IGNORECASE)
# the last part of a name (split on _ - .): SMTP_PASS, SENTRY_DSN, SSH_PRIVATE, MYSQL_PWD, but not BYPASS,
# COMPASS, PASSAGE, DSN_TIMEOUT, PASS_MAX_DAYS or PRIVATE_SUBNET
_SENSITIVE_LAST_PARTS = frozenset({"PASS", "DSN", "PRIVATE", "PWD"})
_NAME_PARTS = re.compile(r"[_.-]+")
# public values under a sensitive-looking name (GPG_KEY: the release key's fingerprint in Python's images)
_PUBLIC_VARIABLES = frozenset({"GPG_KEY"})
MIN_SECRET_LEN = 6        # the configured API key (``extra``) is masked from this length on
MIN_ENV_SECRET_LEN = 8    # an environment variable's value is masked everywhere from this length on
# values that are no secret whatever their variable's name: numbers, times, versions, IPv4 addresses and
# networks (300000, 10.20.0.0/16, 1.2.3), booleans
_PLAIN_VALUE = re.compile(r"[\d.:/,+-]+|true|false|yes|no|on|off|none|null|enabled|disabled", re.IGNORECASE)
MASK = "[REDACTED]"


# A word start: a \b, or right after a JSON escape such as \n (whose "n" would hide the boundary).
_B = r"(?:(?<=\\[nrt])|(?<!\w))"
_V = r"[^\s\"'\\,;&<>]"   # a character of a secret value (never a quote, backslash or separator)
# whitespace in the JSON text: also a tab, CR, form feed or other control space of the line, which the
# JSON form holds as an escape (\t, \r, \f, \u000b, \u001c-\u001f)
_S = r"(?:\s|\\[trf]|\\u00(?:0[bB]|1[c-fC-F]))"
# name-value separators: a JSON key with a string value ("token": "..."), or a name in text, maybe quoted
# (quotes inside the JSON text are escaped: \"). A JSON key with a bare value ("secret": 15 in a tool's own
# counts) is a number or a literal, never masked: the mask would break the JSON.
_ASSIGN = (r"(?:\"" + _S + r"*:" + _S + r"*\"|(?:\\[\"']|')?" + _S + r"*(?:=>|[:=])" + _S
           + r"*(?:\\?[\"'])?)")   # also PHP / Ruby / Perl "=>"
# the same without the value's opening quote: the assignment shapes below take the value by its quoting
_SEP = r"(?:\\[\"']|')?" + _S + r"*(?:=>|[:=])" + _S + r"*"
# An assigned value, as its format delimits it, in whole units of the JSON text (so the mask keeps it
# valid JSON): in the line's double quotes (\"...\") up to the closing quote, escaped quotes (\\\") and
# backslashes (\\\\) included; in single quotes up to the closing one; unquoted up to whitespace or the
# end (; , & < > inside it included: password=ab;cd), but not the , ; or ) that ends it (token: str,). A
# JSON string of the result itself ("token": "...") runs to its closing quote.
_ESCAPED = r"\\\\(?:\\.|[^\\\"])"      # a backslash of the line and the character it escapes
_DQ_VALUE = r"(?:" + _ESCAPED + r"|\\[^\"\\]|[^\\\"])"
_SQ_VALUE = r"(?:" + _ESCAPED + r"|\\[^\\]|[^\\\"'])"
_UQ_VALUE = r"(?:\\\\|[^\s\"'\\])"
_JSON_VALUE = r"(?:\\.|[^\\\"])"
# not a credential: an unquoted value that is an expression reading one (token = ns.token,
# api_key=llm.api_key or ..., token = secrets.token_hex(16)), an empty literal (token=None, password: null)
# or a placeholder (api_key=<set>), or MySQL's PASSWORD('X') function (SET PASSWORD = PASSWORD('X'): the quoted
# X is masked by the SQL shape)
_NOT_LITERAL = (r"(?!(?:[A-Za-z_]\w*\.)+(?:\w*" + "(?:passw(?:or)?d|pass|passphrase|secret|token|key|credentials?)"
                r"(?![\w.])|[A-Za-z_]\w*\()|(?:None|null|nil|undefined|true|false)(?![\w.])|<"
                r"|(?:old_)?password" + r"\((?:\s|\\[trf])*\\?[\"'])")
# a credential's name: it ends with one of these words (so max_tokens, token_count, auth_mode are not)
_SECRET_NAME = (r"(?:passw(?:or)?d|(?:(?<![a-z])|(?<=\\[nrt]))pass|passphrase|secret|token|"
                r"api[_-]?key|apikey|access[_-]?key|"
                r"(?:private|secret|signing|encryption|master|client|session|auth|account|app)[_-]?key|"
                r"secret[_-]?key[_-]?base|authtok|(?:(?<![a-z])|(?<=\\[nrt]))psk|"
                r"credentials?|(?:key|cert|certificate)[_-]data)")
_CLI_FLAG = (r"(?:password|passwd|pass(?:in|out)?|passphrase|pwd|token|secret|api-?key|auth-token|"
             r"(?:src|dest)?(?:store|key)pass|"        # keytool / jarsigner: -storepass, -srckeypass
             r"access-token|client-secret)")
# programs whose short option carries a password: mysql -pSECRET, sshpass -p SECRET, redis-cli -a SECRET
_LINE = r"(?:[^\\\n]|\\\"){0,200}?"   # further on the same line (never over an escaped newline), not far
# an argument (not an option), maybe quoted, and the space after it
_ARG = r"(?:\\?[\"'])?[^\s\"'\\-][^\s\"'\\]*(?:\\?[\"'])?\s+"
_HT_FLAGS = r"(?:\s+-[A-Za-z]+(?:\s+\d+)?)*"   # htpasswd's options (-C 10)
_HT_ARG = r"(?!\d+\s)" + _ARG                    # an argument after them (a lone number belongs to -C)
# a URL's scheme: short, so that a long run of a-a-a-... is not scanned again from each of its letters
_URL = r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,30}://"


def _assignments(name: str, value_guard: str = "") -> list[tuple[re.Pattern[str], str]]:
    """The shapes of ``name`` assigned a value, one for each way of quoting it (see ``_DQ_VALUE``): the
    value masked, what comes before it kept. ``value_guard``: a lookahead the value must pass."""
    keep = r"(?!\[REDACTED\]|(?:Bearer|Basic|Token)" + _S + r")" + value_guard
    return [(re.compile(r"(" + name + r"(?:\"" + _S + r"*:" + _S + r"*|" + _SEP + r")\")" + keep + _JSON_VALUE
                        + r"{4,}", re.I), r"\1" + MASK),
            (re.compile(r"(" + name + _SEP + r"\\\")" + keep + _DQ_VALUE + r"{4,}", re.I), r"\1" + MASK),
            (re.compile(r"(" + name + _SEP + r"')" + keep + _SQ_VALUE + r"{4,}", re.I), r"\1" + MASK),
            (re.compile(r"(" + name + _SEP + r")(?![\"'])" + keep + _NOT_LITERAL + _UQ_VALUE + r"{4,}(?<![,;)])",
                        re.I), r"\1" + MASK)]


def _basic(m: re.Match) -> str:
    """``Basic <base64>`` masked when the base64 decodes to ``user:password`` (not "Basic usage")."""
    try:
        decoded = base64.b64decode(m.group(2) + "=" * (-len(m.group(2)) % 4), validate=True)
    except (ValueError, binascii.Error):
        return m.group(0)
    return m.group(1) + MASK if b":" in decoded else m.group(0)


# Directives: NAME VALUE, the value alone at the end of its line (a ; or a " # comment" after it aside):
# redis's requirepass / masterauth, nslcd's bindpw, kickstart's rootpw [--plaintext], HAProxy's
# insecure-password, BIND's secret "X"; (anywhere on a line: redis's CONFIG SET requirepass X), and a config
# key whose name ends with a secret word after a letter or digit and a _ . or - (keepalived's auth_pass,
# SMTP_PASSWORD) on a config line (``_CONFIG_LINE_START``): first on its line, after indentation, a YAML
# list's "- ", one of CONFIG_KEY_PREFIXES (SetEnv DB_PASSWORD X, Dockerfile's ENV / ARG), a comment leader
# (COMMENT_LEADERS: a commented-out config line is still one, "# DB_PASSWORD X", ";auth_pass X"), a label of
# one word and a colon ("vrrp: auth_pass X", grep's "conf.d/k.conf:12:"), or after a shell's && or || ("RUN
# make && DB_PASSWORD X"); never an option's (--no-password mydb). Prose and log lines are left alone:
# "password reset link sent" (a bare word, and more than one word after it), "--password X" (an option: see
# the CLI shapes), "auth_pass is required" (more than one word after the name), "user alice requested
# reset_password alice" and "vrrp auth_pass X" (a word, or two or more, before the key that is no prefix or
# label), "INFO: SMTP_PASSWORD X", "10:00:01: auth_pass X" (a log level or a time as the label),
# "csrf_token refreshed" (a word that reads as a status, _STATUS_WORD), "grpc_auth_token Bearer" (a status or
# a plain value after a config key, STATUS_WORDS and PLAIN_VALUES), "masterauth configured", "rootpw locked"
# (after a known directive only the status phrasings of DIRECTIVE_STATUS_WORDS: "requirepass Bearer",
# "bindpw changed" are passwords).
MAX_DIRECTIVE_PREFIX = 60     # characters of a directive's name before its secret word (SMTP_ in SMTP_PASSWORD)
DIRECTIVE_WORDS = ("requirepass", "masterauth", "bindpw", "rootpw", "insecure-password")
QUOTED_DIRECTIVE_WORDS = DIRECTIVE_WORDS + ("secret",)     # secret "X"; (BIND): with a quoted value only
# words that may come before a config key first on its line: Apache's SetEnv, csh's setenv, export, nginx's
# fastcgi_param, Dockerfile's ENV and ARG (matched whatever their case)
CONFIG_KEY_PREFIXES = ("setenv", "export", "fastcgi_param", "env", "arg")
# comment leaders a commented-out config line may start with (a space after them or not: "#auth_pass X",
# "; smtp_password X", "//SMTP_PASSWORD X", "!auth_pass X"), up to MAX_COMMENT_LEADERS of them ("## X")
COMMENT_LEADERS = ("#", ";", "//", "!")
# comment leaders that need a space after them: "-- DB_PASSWORD X" (SQL, Lua) is a comment, "--no-password
# mydb" first on a line is an option
SPACED_COMMENT_LEADERS = ("--",)
MAX_COMMENT_LEADERS = 4
# a label before a config key ("vrrp: auth_pass X", grep -n's "conf.d/keepalived.conf:12:"): one word of up to
# MAX_CONFIG_LABEL characters, maybe a :LINE number, then a colon and a space; not a log level (LOG_LEVELS:
# "INFO: SMTP_PASSWORD X"), not a date, time, version or address ("10:00:01:", "2026-11-27:")
MAX_CONFIG_LABEL = 80
# values that read as a status, not a password, after a config key, in a .pgpass or postfix line (matched
# whatever their case): "csrf_token refreshed", "[mail.example.com]:587 relay:deferred"
STATUS_WORDS = ("missing", "invalid", "required", "unset", "set", "empty", "none", "ok", "error", "mismatch",
                "ready", "present", "absent", "unknown", "pending", "active", "inactive", "valid", "configured",
                "locked", "unlocked", "enabled", "disabled", "changed", "updated", "expired", "rotated", "reset",
                "denied", "failed", "accepted", "rejected", "cleared", "removed", "ignored", "loaded", "saved",
                "stored", "applied", "deferred", "queued", "sent", "done")
# the only values that read as a status after a known directive (the phrasings daemons log: "masterauth
# configured", "rootpw locked"), any case; any other word is its password ("requirepass Bearer", "masterauth
# Token", "bindpw changed")
DIRECTIVE_STATUS_WORDS = ("configured", "locked", "unlocked", "disabled", "enabled", "required", "not set")
# values that are no secret after a config key: switches, literals, an auth scheme alone
# ("grpc_auth_token Bearer"), a wildcard
PLAIN_VALUES = ("yes", "no", "true", "false", "on", "off", "null", "nil", "bearer", "basic", "token", "*")
LOG_LEVELS = frozenset({"trace", "debug", "info", "notice", "warn", "warning", "error", "err", "crit", "critical",
                        "alert", "emerg", "fatal", "severe", "fine", "finer", "finest", "verbose"})
_WORD_END = r"(?![\w.-])"
_PLAIN_OR_STATUS = r"(?:" + "|".join(re.escape(w) for w in STATUS_WORDS + PLAIN_VALUES) + r")" + _WORD_END
# the guard of a known directive's value: not one of DIRECTIVE_STATUS_WORDS (requirepass foobared is a
# password: no -ed rule there)
_NOT_STATUS = (r"(?!(?:" + "|".join((_S + "+").join(re.escape(part) for part in w.split())
                                    for w in DIRECTIVE_STATUS_WORDS) + r")" + _WORD_END + r")")
# the guard of a config key's value: also any lower-case word ending in -ed or -ing ("api_key missing",
# "session_token caching")
_STATUS_WORD = r"(?!(?-i:[a-z]+(?:ed|ing))" + _WORD_END + r"|" + _PLAIN_OR_STATUS + r")"
_STATUS_VALUE = re.compile(r"(?-i:[a-z]+(?:ed|ing))|(?:" + "|".join(re.escape(w) for w in STATUS_WORDS + PLAIN_VALUES)
                           + r")", re.I)    # the same, for a whole value in Python (fullmatch)
_KNOWN_STATUS_VALUE = re.compile("|".join(re.escape(w) for w in STATUS_WORDS + PLAIN_VALUES), re.I)

# The start of a row (a line of the text): the start of the text, after a line break (in the JSON text the
# \n or \r escape), or after the quote that opens a JSON string (a closing one is never followed by a word)
_ROW_START = r"(?:^|(?<=[\n\r])|(?<=\\[nr])|(?<=(?<!\\)\"))"
# the end of a row: the end of the text, a line break, the closing quote of a JSON string
_ROW_END = r"(?:$|[\n\r]|\\[nr]|\")"
# a row's "line N: " prefix (a line quoted by its number: "line 3: db.example.com:5432:...")
_ROW_LINE_LABEL = r"(?:line" + _S + r"+\d{1,7}:" + _S + r"+)?"
# what may end a row after its last field: whitespace, and a " # comment" (after whitespace: a # right after
# a value is part of it); the comment runs to the end of the row, never over a line break or the JSON string's
# closing quote
_ROW_TAIL = r"(?:" + _S + r"+#(?:\\[^nr]|[^\\\"\n\r])*|" + _S + r"*)" + _ROW_END

# a config key whose name ends with a secret word after a _ . or - (SMTP_PASSWORD, auth_pass)
_CONFIG_KEY = r"[A-Za-z0-9][\w.-]{0,%d}?[_.-]" % MAX_DIRECTIVE_PREFIX + _SECRET_NAME + r"(?![\w.-])"
_COMMENT = (r"(?:(?:" + "|".join(re.escape(c) for c in COMMENT_LEADERS) + r"){1,%d}" % MAX_COMMENT_LEADERS + _S
            + r"*|(?:" + "|".join(re.escape(c) for c in SPACED_COMMENT_LEADERS) + r")" + _S + r"+)")
_CONFIG_LABEL = (r"(?!(?:" + "|".join(sorted(LOG_LEVELS)) + r")" + _S + r"*:)(?!\d+[-/:.]\d)[\w./@-]{1,%d}"
                 % MAX_CONFIG_LABEL + r"(?::\d{1,7})?:" + _S + r"+")
# where a config line's key may stand: first on its line (after indentation, a label, a comment leader), or
# after a shell's && or ||
_CONFIG_LINE_START = (r"(?:" + _ROW_START + _S + r"*(?:" + _CONFIG_LABEL + r")?(?:" + _COMMENT + r")?|(?<=&&|\|\|)"
                      + _S + r"+)")
# the key there: maybe after a YAML list's dash and a CONFIG_KEY_PREFIXES word
_CONFIG_LINE_KEY = (_CONFIG_LINE_START + r"(?:-" + _S + r"+)?(?:(?:" + "|".join(CONFIG_KEY_PREFIXES) + r")" + _S
                    + r"+)?" + _CONFIG_KEY)
# a known directive word, anywhere (a word of its own), then maybe options (rootpw --plaintext)
_KNOWN_DIRECTIVE = (r"(?:(?<=\\[nrt])|(?<![\w.\\-]))(?:%s)(?![\w.-])(?:" + _S + r"+--?[A-Za-z][\w-]*){0,4}")


def _directive(words: Iterable[str]) -> str:
    """A directive's name: one of ``words`` (then maybe options: rootpw --plaintext), or a config key on a
    config line (``_CONFIG_LINE_KEY``)."""
    return r"(?:" + _KNOWN_DIRECTIVE % "|".join(words) + r"|" + _CONFIG_LINE_KEY + r")"


# the end of a directive's line, after its value: a ; and a " # comment" may follow
_DIRECTIVE_END = r"(?:" + _S + r"*;)?(?:" + _S + r"+#.*?)?" + _S + r"*(?:$|[\n\r]|\\[nr]|\")"
# a key="...secret" or name="...secret" attribute (.NET appSettings <add key="DbPassword" value="X"/>, <entry
# key="db.password">, Spring's <property name="password" value="X"/>)
_XML_KEY = r"(?<![\w.-])(?:key|name)=\\?[\"'][^\"'\\<>\s]{0,100}?" + _SECRET_NAME + r"\\?[\"']"
YAML_BLOCK_SCALAR = r"[|>][-+0-9]{0,2}"     # the indicator of a YAML block value (password: |)


def _yaml_block(m: re.Match[str]) -> str:
    """A YAML block value after a secret key (``password: |`` then its lines, in the JSON text: each line
    after a \\n escape): each of its lines, those indented deeper than the key, masked."""
    line_start = m.string.rfind("\\n", 0, m.start()) + 1
    line_start = line_start + 1 if line_start else m.string.rfind('"', 0, m.start()) + 1
    prefix = m.string[line_start:m.start()]
    key_indent = len(prefix) - len(prefix.lstrip(" -"))
    body, rest = m.group(2), ""
    if "\\N" in body:     # matched by IGNORECASE, not a line break (text that is not JSON): the lines end there
        body, rest = body[:body.index("\\N")], body[body.index("\\N"):]
    lines = body.split("\\n")[1:]
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip(" "))
        if indent <= key_indent:
            if line.strip(" "):
                break
            continue        # a blank line inside the value
        lines[i] = line[:indent] + MASK
    return m.group(1) + "".join("\\n" + line for line in lines) + rest


# .pgpass rows: without the file's name (the tools refuse to read a .pgpass: this is a copy of its lines)
# a row host:port:db:user:password is masked only when it reads as one: the host a host name, an IP address
# or *, not a file name (app.py:42:10:warning:unused-variable, compilers' and linters' output), not a
# number (10:22:33:444:INFO, a time), no field a log level, the password not a status word, the row not part
# of an IPv6 address (2001:4860:4860:0:8888, fe80:1:2:3:abcd: every field 1 to 4 hex digits)
_IPV6_GROUP = re.compile(r"[0-9A-Fa-f]{1,4}")     # every field one: part of an IPv6 address (fe80:1:2:3:abcd)
_PGPASS_HOST = re.compile(r"\*|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
# file name endings that make a first field NAME.EXT a file, not a host (source, log and config files; a host
# with more dots, db.example.pl, stays a host)
FILE_NAME_SUFFIXES = (".py", ".pyi", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".rb", ".go", ".java", ".kt",
                      ".scala", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".rs", ".php", ".pl", ".pm", ".sh", ".lua",
                      ".swift", ".vue", ".log", ".txt", ".conf", ".cfg", ".ini", ".yml", ".yaml", ".json", ".toml",
                      ".xml", ".html", ".css", ".sql", ".md")


def _pgpass(m: re.Match[str]) -> str:
    """A .pgpass row (``HOST:PORT:DB:USER:PASSWORD``) with its password masked, when it reads as one."""
    host, _, _, _, password = fields = m.groups()
    if (not _PGPASS_HOST.fullmatch(host) or host.isdigit()
            or (host.count(".") == 1 and host.lower().endswith(FILE_NAME_SUFFIXES))
            or any(field.lower() in LOG_LEVELS for field in fields) or _KNOWN_STATUS_VALUE.fullmatch(password)
            or all(_IPV6_GROUP.fullmatch(field) for field in fields)):
        return m.group(0)
    return m.group(0)[:m.start(5) - m.start()] + MASK


# postfix's sasl_passwd rows, without the file's name: [HOST]:PORT USER:PASSWORD is masked when HOST is a
# host name (with a letter, not a log level: [WARN] worker:X) or an IP address ([2024-11-27]:00 is a date), USER
# a login (user or user@domain) and the password not a status word ([mail.example.com]:587
# relay:deferred is a mail log)
_LOGIN = re.compile(r"[\w.%+-]+(?:@[\w.-]+)?")
_HOST_NAME = re.compile(r"(?=[\w.-]*[A-Za-z])[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?")


def _sasl_passwd(m: re.Match[str]) -> str:
    """A sasl_passwd row with its password masked, when it reads as one."""
    host, user, password = m.group(2), m.group(3), m.group(4)
    if host.lower() in LOG_LEVELS:
        return m.group(0)
    if not _HOST_NAME.fullmatch(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return m.group(0)
    if not _LOGIN.fullmatch(user) or _STATUS_VALUE.fullmatch(password):
        return m.group(0)
    return m.group(1) + MASK


def _quoted_values(prefix: str, unquoted: str = "", keep: str = "") -> list[tuple[re.Pattern[str], str]]:
    """The shapes of a value after ``prefix`` (which ends where the value's quote would start), the value
    masked: in the line's double quotes (\\"...\\" in the JSON text), in single quotes, and, when
    ``unquoted`` is given (the pattern of an unquoted value), unquoted. ``keep``: a quoted value left as it is
    (a pattern of the whole value, without its quotes)."""
    dq_keep = r"(?!(?:" + keep + r")\\\")" if keep else ""
    sq_keep = r"(?!(?:" + keep + r")')" if keep else ""
    shapes = [(re.compile(r"(" + prefix + r"\\\")(?!\[REDACTED\])" + dq_keep + _DQ_VALUE + r"+(?=\\\")", re.I),
               r"\1" + MASK),
              (re.compile(r"(" + prefix + r"')(?!\[REDACTED\])" + sq_keep + _SQ_VALUE + r"+(?=')", re.I), r"\1" + MASK)]
    if unquoted:
        shapes.append((re.compile(r"(" + prefix + r")(?!\[REDACTED\]|\\?[\"'])" + unquoted, re.I), r"\1" + MASK))
    return shapes


# WordPress's keys and salts (wp-config.php): these eight constants only (AUTH_KEY and SECURE_AUTH_KEY also end
# with a secret name: auth_key). Any other *_KEY or *_SALT constant is no secret: define('CACHE_KEY',
# 'user_profile'), define('PRIMARY_KEY', 'id'), define('SORT_KEY', 'created_at'), WP_CACHE_KEY_SALT (a cache prefix)
WORDPRESS_KEYS = ("AUTH_KEY", "SECURE_AUTH_KEY", "LOGGED_IN_KEY", "NONCE_KEY",
                  "AUTH_SALT", "SECURE_AUTH_SALT", "LOGGED_IN_SALT", "NONCE_SALT")
# the placeholder wp-config-sample.php ships in those eight: public, and left visible (it tells that the keys
# were never set)
WORDPRESS_PLACEHOLDER = "put your unique phrase here"
# a define()'s constant: a secret name (DB_PASSWORD, API_KEY, SECRET_KEY), or one of WORDPRESS_KEYS
_DEFINE_NAME = (r"(?:[\w.-]{0,60}?" + _SECRET_NAME + r"|" + "|".join(WORDPRESS_KEYS) + r")")
# a Kubernetes env entry's name: a secret name (DB_PASSWORD, STRIPE_SECRET), then its value: on the next line
# (more indented or not: "- name: X" then "  value: V"), or after a comma in a flow mapping
_ENV_PAIR = (r"(?:(?<=\\[nrt])|(?<![\w-]))name(?:\\?[\"'])?" + _S + r"*:" + _S + r"*(?:\\?[\"'])?[\w.-]{0,80}?"
             + _SECRET_NAME + r"(?:\\?[\"'])?(?:" + _S + r"*,|" + _S + r"*(?:\\r)?\\n)" + _S + r"*(?:\\?[\"'])?"
             r"value(?:\\?[\"'])?" + _S + r"*:" + _S + r"*")
# cookies: a name (a token) and a value (no whitespace, ; , quote or backslash)
_COOKIE_NAME = r"[^\s=;,\"'\\]{1,200}"
_COOKIE_VALUE = r"(?:\\\\|[^\s;,\"'\\])"
_COOKIE_PAIR = _COOKIE_NAME + r"=" + _COOKIE_VALUE + r"*"
_COOKIE_VALUES = re.compile(r"(=)" + _COOKIE_VALUE + r"+")


def _cookies(m: re.Match[str]) -> str:
    """A Cookie header with every cookie's value masked."""
    return m.group(1) + _COOKIE_VALUES.sub(r"\1" + MASK, m.group(2))


# redis MONITOR lines: 1714000000.123 [0 127.0.0.1:5000] "COMMAND" "ARG" ... (in the JSON text each quote is \")
_MONITOR_ARG = r"\\\"" + _DQ_VALUE + r"{0,200}?\\\""     # one argument, in its quotes
MAX_MONITOR_PAIRS = 16      # parameter-value pairs of a CONFIG SET before requirepass / masterauth, at most


def _monitor_command(name: str) -> str:
    """``name`` (a redis command, in its quotes) at the command position of a MONITOR line: right after the
    line's ``[db addr]`` bracket and its space, or first on its line (the start of the text, after a line
    break, after the JSON string's opening quote). The quoted name comes first, so that Python's re skips
    ahead to it; the position is checked behind it (each lookbehind has one width)."""
    word = r"\\\"" + name + r"\\\""
    return (word + r"(?:(?<=\] " + word + r")|(?<=\\[nr]" + word + r")|(?<=[\n\r]" + word + r")|(?<=^" + word
            + r")|(?<=(?<!\\)\"" + word + r"))")


MAX_PPK_LINES = 200     # lines of a PuTTY key's Private-Lines block masked at most (the header says how many)


def _ppk_lines(m: re.Match[str]) -> str:
    """A PuTTY key's Private-Lines: N header and its N lines (in the JSON text, each after a \\n escape), masked."""
    count = min(int(m.group(2)), MAX_PPK_LINES)
    lines = m.group(3).split("\\n")          # [""] + the lines (each maybe ending in \r)
    for i in range(1, min(count, len(lines) - 1) + 1):
        lines[i] = MASK + ("\\r" if lines[i].endswith("\\r") else "")
    return m.group(1) + "\\n".join(lines)


SECRET_SHAPES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    # PEM private keys: the whole block (JSON text holds its newlines as \n); PGP ones end in "BLOCK"
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
                r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|$)", re.S), MASK),
    # a base64-encoded PEM block ("-----BEGIN" = LS0tLS1CRUdJTi): kubeconfig's client-key-data and the like
    (re.compile(_B + r"LS0tLS1CRUdJTi[A-Za-z0-9+/=]{16,}(?:\.{3})?"), MASK),
    # scheme://user:password@host -> scheme://user:[REDACTED]@host; the password runs to the last @ before
    # the host (mysql://app:p@ss@db)
    (re.compile(r"(" + _URL + r"[^\s:/@\"'\\]*:)[^\s/\"'\\]+(@)"), r"\1" + MASK + r"\2"),
    # a DSN's user info, also without a password (SENTRY_DSN=https://KEY@o1.ingest.sentry.io/5), and a
    # Sentry key (32 hex digits) as the user of a URL
    (re.compile(r"((?:(?<![a-z])|(?<=\\[nrt]))dsn(?![\w])" + _ASSIGN + _URL + r")(?!\[REDACTED\]@)"
                r"[^\s/\"'\\]+(@)", re.I), r"\1" + MASK + r"\2"),
    (re.compile(r"(\bhttps?://)[0-9a-f]{32}(@)"), r"\1" + MASK + r"\2"),
    # Authorization: Bearer / Token credentials: a word after them is one when it holds a digit or is
    # long ("token refreshed", "Bearer authentication" are prose); GitLab's PRIVATE_TOKEN too; Basic:
    # base64 of "user:password"
    (re.compile(r"((?:(?<=\\[nrt])|(?<![^\W_]))(?:Bearer|Token)\s+)"
                r"(?:(?=[A-Za-z._~+/=-]*[0-9])|(?=[A-Za-z0-9._~+/=-]{20}))"
                r"[A-Za-z0-9._~+/=-]{8,}", re.I), r"\1" + MASK),
    (re.compile(r"(" + _B + r"Basic\s+)([A-Za-z0-9+/]{6,}={0,2})", re.I), _basic),
    # provider key formats and JWTs
    (re.compile(_B + r"(?:sk|pk|rk)-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(_B + r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"), MASK),
    (re.compile(_B + r"(?:AKIA|ASIA)[A-Z0-9]{16}\b"), MASK),
    (re.compile(_B + r"(?:gh[pousr]_[A-Za-z0-9]{30,}\b|github_pat_[A-Za-z0-9_]{30,})"), MASK),
    (re.compile(_B + r"glpat-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(_B + r"(?:xox[abeprs]-[A-Za-z0-9-]{10,}|xapp-\d-[A-Za-z0-9-]{10,})"), MASK),     # Slack
    (re.compile(_B + r"hv[sbr]\.[A-Za-z0-9_-]{24,}"), MASK),          # HashiCorp Vault tokens
    # Vault's older tokens: s. and 24 letters and digits, with a capital, a small letter and a digit among
    # them ("s.AbCd...12"; a word such as s.length or s.toString() is none), b.AAAAAQ... batch tokens
    (re.compile(r"(?:(?<=\\[nrt])|(?<![\w.@/\\-]))(?:s\.(?=[A-Za-z0-9]{0,23}[0-9])(?=[A-Za-z0-9]{0,23}[A-Z])"
                r"(?=[A-Za-z0-9]{0,23}[a-z])[A-Za-z0-9]{24}|b\.AAAAAQ[A-Za-z0-9_-]{40,})(?![\w.-])"), MASK),
    # GitLab: runner (glrt-), pipeline trigger (glptt-), deploy (gldt-) ... tokens and runner registration
    # tokens (GR1348941...); Shopify (shpat_ ...), DigitalOcean (dop_v1_ ...), SendGrid (SG.x.y)
    (re.compile(_B + r"(?:gl(?:rt|ptt|dt|soat|ft|imt|agent|oas|cbt|ffct|rtr|wt)-[A-Za-z0-9_.-]{20,}"
                r"|GR1348941[A-Za-z0-9_-]{20,})"), MASK),
    (re.compile(_B + r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}\b"), MASK),
    (re.compile(_B + r"do[opr]_v1_[a-fA-F0-9]{64}\b"), MASK),
    (re.compile(_B + r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(_B + r"AIza[A-Za-z0-9_-]{35}\b"), MASK),
    (re.compile(_B + r"(?:npm_[A-Za-z0-9]{36}|hf_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{40,})\b"), MASK),
    (re.compile(_B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),
    # password hashes: crypt(3) / htpasswd / shadow ($apr1$, $1$, $2y$, $5$, $6$, $y$, $argon2id$, ...), {SHA}
    (re.compile(r"(?<![\w$])\$(?:apr1|1|2[abxy]?|5|6|7|y|gy|argon2(?:id|i|d)|scrypt|pbkdf2[\w-]*)\$"
                r"[./A-Za-z0-9$,=+-]{8,}"), MASK),
    (re.compile(r"\{(?:S?SHA(?:256|512)?|SMD5|MD5|CRYPT|PBKDF2[\w-]*)\}[A-Za-z0-9+/=.$]{8,}"), MASK),
    # name = value assignments (password=..., "token": "...", api_key: ..., db_pass: ..., client-key-data: ...)
    # (the name must END with the secret word: max_tokens, token_count or auth_mode are not secrets; what
    # comes before the word, DB_ in DB_PASSWORD, stays outside the match: matching it too made a long run
    # such as a-a-a-a-... quadratic)
    # (the value as its format delimits it: "ab\"cd", password=ab;cd, password\t=\tS3cret; not an
    # expression reading one, token = ns.token)
    *_assignments(_SECRET_NAME + r"(?![\w])"),
    # XML elements: <password>S3cret</password>, <db.password>, <apiKey>, <token> (the name ends with
    # the secret word, as above); the value runs to the closing tag
    (re.compile(r"(" + _SECRET_NAME + r">)(?!\[REDACTED\]<)(?:[^<\s\"'\\]|\\[\\\"'/]){4,}(?=</)", re.I),
     r"\1" + MASK),
    # directives (see _directive): requirepass S3cret, rootpw --plaintext S3cret, SMTP_PASSWORD S3cret,
    # secret "S3cret"; (an unquoted value has no whitespace: it runs to the end of its line)
    (re.compile(r"(" + _KNOWN_DIRECTIVE % "|".join(DIRECTIVE_WORDS) + _S + r"+)(?!-|\[REDACTED\])" + _NOT_LITERAL
                + _NOT_STATUS + _UQ_VALUE + r"{4,}?(?=" + _DIRECTIVE_END + r")", re.I), r"\1" + MASK),
    (re.compile(r"(" + _CONFIG_LINE_KEY + _S + r"+)(?!-|\[REDACTED\])" + _NOT_LITERAL
                + _STATUS_WORD + _UQ_VALUE + r"{4,}?(?=" + _DIRECTIVE_END + r")", re.I), r"\1" + MASK),
    (re.compile(r"(" + _directive(QUOTED_DIRECTIVE_WORDS) + _S + r"+\\?\")(?!\[REDACTED\])" + _DQ_VALUE
                + r"{4,}(?=\\?\"" + _DIRECTIVE_END + r")", re.I), r"\1" + MASK),
    (re.compile(r"(" + _directive(QUOTED_DIRECTIVE_WORDS) + _S + r"+')(?!\[REDACTED\])" + _SQ_VALUE
                + r"{4,}(?='" + _DIRECTIVE_END + r")", re.I), r"\1" + MASK),
    # HAProxy: stats auth USER:PASSWORD
    (re.compile(r"(" + _B + r"stats" + _S + r"+auth" + _S + r"+[^\s:\"'\\]+:)(?!\[REDACTED\])" + _V + r"{4,}",
                re.I), r"\1" + MASK),
    # .pgpass: HOST:PORT:DATABASE:USER:PASSWORD (PORT a number or *), the whole row; postfix's sasl_passwd:
    # [HOST]:PORT USER:PASSWORD, the whole row (see _pgpass and _sasl_passwd: which such rows are masked); the
    # row maybe indented or quoted as "line N: ", maybe followed by whitespace and a " # comment" (_ROW_TAIL)
    (re.compile(_ROW_START + _S + r"*" + _ROW_LINE_LABEL + r"([^\s:\"'\\]+):(\d{1,5}|\*):([^\s:\"'\\]+):"
                r"([^\s:\"'\\]+):(?!\[REDACTED\])((?:\\\\|[^\s:\"'\\]){4,})(?=" + _ROW_TAIL + r")"), _pgpass),
    (re.compile(_ROW_START + r"(" + _S + r"*" + _ROW_LINE_LABEL + r"\[([^\s\]\"'\\]+)\](?::\d{1,5})?" + _S
                + r"+([^\s:\"'\\]+):)(?!\[REDACTED\])((?:\\\\|\\\"|[^\s\"\\]){4,})(?=" + _ROW_TAIL + r")"),
     _sasl_passwd),
    # key/value XML: <add key="DbPassword" value="S3cret" />, <entry key="db.password">S3cret</entry>
    (re.compile(r"(" + _XML_KEY + _S + r"+value=\\?[\"'])(?!\[REDACTED\])(?:\\\\|[^\"'\\]){4,}", re.I),
     r"\1" + MASK),
    (re.compile(r"(" + _XML_KEY + _S + r"*>)(?!\[REDACTED\]<)(?:\\\\|[^<\"'\\]){4,}(?=</)", re.I), r"\1" + MASK),
    # a YAML block value after a secret key: password: | (or >-, |2 ...) and the lines under it
    (re.compile(r"(" + _SECRET_NAME + r"(?![\w])(?:\\?[\"'])?" + _S + r"*: +" + YAML_BLOCK_SCALAR
                + r"(?: |\\t)*(?:\\r)?)((?:\\n(?: +(?:\\[^n]|[^\\\"\n])*)?)+)", re.I), _yaml_block),
    # webhook URLs, whose path is the credential: Slack, Discord
    (re.compile(r"(hooks\.slack\.com/(?:services|workflows|triggers)/)(?!\[REDACTED\])[A-Za-z0-9_/-]{8,}", re.I),
     r"\1" + MASK),
    (re.compile(r"(discord(?:app)?\.com/api/webhooks/\d+/)(?!\[REDACTED\])[A-Za-z0-9_-]{16,}", re.I), r"\1" + MASK),
    # pwd=... (MYSQL_PWD, ODBC's PWD=): not a path, so that a shell's PWD=/home/ops stays
    *_assignments(r"pwd(?![\w])", r"(?![/~])"),
    # SQL: CREATE|ALTER USER/ROLE ... WITH [ENCRYPTED] PASSWORD 'X', IDENTIFIED [WITH plugin] BY 'X' (a quoted
    # literal only: "login with password authentication" is prose)
    (re.compile(r"(" + _B + r"(?:with" + _S + r"+(?:encrypted" + _S + r"+)?password|identified(?:" + _S
                + r"+with" + _S + r"+\w+)?" + _S + r"+by)" + _S + r"+')(?!\[REDACTED\])" + _SQ_VALUE + r"{4,}", re.I),
     r"\1" + MASK),
    # "auth": "<base64 user:password>" (docker's config.json, .npmrc's _auth, basic_auth: user:pass):
    # only a credential-looking value (12+ characters, a digit among them), so auth: required stays
    (re.compile(r"((?:(?<![a-z])|(?<=\\[nrt]))auth(?![\w])" + _ASSIGN + r")"
                r"(?=[A-Za-z0-9+/=_.:-]{0,200}?\d)[A-Za-z0-9+/=_.:-]{12,}", re.I), r"\1" + MASK),
    # command-line passwords: --password S3cret, --db-password S3cret, --admin-pass S3cret (the = form is
    # an assignment above; not --no-password, a switch), -passin pass:S3cret (the parts before the flag
    # word never hold a - or _ , so that a run such as a-a-a-... is split one way only)
    (re.compile(r"((?:(?<=\\[nrt])|(?<![\w}-]))--?(?!no[-_])(?:[a-z0-9]+[-_])*" + _CLI_FLAG + _S
                + r"+)(?!-|\[REDACTED\])"
                + _V + r"{4,}", re.I),
     r"\1" + MASK),
    (re.compile(r"(" + _B + r"(?:mysql\w*|mariadb\w*)\b" + _LINE + r"\s-p)(?!\[REDACTED\])" + _V + r"+"),
     r"\1" + MASK),
    (re.compile(r"(" + _B + r"sshpass\b" + _LINE + r"\s-p\s*)(?!\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    (re.compile(r"(" + _B + r"redis-cli\b" + _LINE + r"\s-a\s*)(?!\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    (re.compile(r"(" + _B + r"curl\b" + _LINE + r"\s(?:-u|--user)\s*[^\s:\"'\\]+:)(?!\[REDACTED\])" + _V + r"+"),
     r"\1" + MASK),
    (re.compile(r"(" + _B + r"(?:docker|podman|buildah|skopeo|nerdctl|oras)\s+login\b" + _LINE
                + r"\s-p\s*)(?!-|\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    (re.compile(r"(" + _B + r"ldap[a-z]*\b" + _LINE + r"\s-w\s*)(?!-|\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    (re.compile(r"(" + _B + r"(?:smbclient|rpcclient|smbcacls|smbget)\b" + _LINE
                + r"\s(?:-U|--user)(?:=|\s*)(?:[^\s%\"'\\]|\\\\)+%)(?!\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    (re.compile(r"(" + _B + r"openssl\b" + _LINE + r"\s-[kK]\s+)(?!-|\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    (re.compile(r"(" + _B + r"mysqladmin\b" + _LINE + r"\spassword\s+(?:\\?[\"'])?)(?!-|\[REDACTED\])" + _V + r"+"),
     r"\1" + MASK),
    (re.compile(r"(" + _B + r"rabbitmqctl\b" + _LINE + r"\s(?:add_user|change_password)\s+" + _ARG
                + r"(?:\\?[\"'])?)(?!-|\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    # htpasswd -b[...] [FILE] USER PASSWORD: with -n no FILE (-C takes a number, never an argument here)
    (re.compile(r"(" + _B + r"htpasswd(?=" + _HT_FLAGS + r"?\s+-[A-Za-z]*b)(?:(?=" + _HT_FLAGS + r"?\s+-[A-Za-z]*n)"
                + _HT_FLAGS + r"\s+" + _HT_ARG + r"|(?!" + _HT_FLAGS + r"?\s+-[A-Za-z]*n)" + _HT_FLAGS + r"\s+"
                + _HT_ARG + _HT_ARG + r")(?:\\?[\"'])?)(?!-|\[REDACTED\])" + _V + r"+"), r"\1" + MASK),
    # vault login TOKEN (not an option, not a name=value pair; a token holds a digit or a dot, or is long:
    # "vault login with your token" is prose)
    (re.compile(r"(" + _B + r"vault\s+login(?:\s+-[^\s\"'\\]+)*\s+)(?![\w.-]*=|-|\[REDACTED\])"
                r"(?:(?=[^\s\"'\\]*[\d.])|(?=" + _V + r"{16}))" + _V + r"{4,}"), r"\1" + MASK),
    # netrc: machine HOST login USER password SECRET
    (re.compile(r"(" + _B + r"login\s+\S+\s+password\s+)(?!\[REDACTED\])" + _V + r"+", re.I), r"\1" + MASK),
    # PHP's define('NAME', 'VALUE') (WordPress's wp-config.php): NAME ending with a secret word, or one of
    # WordPress's eight keys and salts (WORDPRESS_KEYS); a quoted value only (define('DB_PASSWORD', getenv(...))
    # stays), not WordPress's placeholder (WORDPRESS_PLACEHOLDER)
    *_quoted_values(_B + r"define" + _S + r"*\(" + _S + r"*(?:'" + _DEFINE_NAME + r"'|\\\"" + _DEFINE_NAME + r"\\\")"
                    + _S + r"*," + _S + r"*", keep=re.escape(WORDPRESS_PLACEHOLDER)),
    # SQL: CREATE|ALTER USER|ROLE|GROUP ... PASSWORD 'X' (PostgreSQL: ALTER USER app PASSWORD 'X', CREATE ROLE
    # bob LOGIN PASSWORD 'X'); MySQL's SET PASSWORD [FOR 'u'@'h'] = 'X' (or = PASSWORD('X'))
    *_quoted_values(_B + r"(?:create|alter)" + _S + r"+(?:user|role|group)\b" + _LINE + r"\bpassword" + _S + r"+"),
    *_quoted_values(_B + r"set" + _S + r"+password\b(?:" + _S + r"+for" + _S + r"+(?:[^=\\\n]|\\\"){1,120}?)?" + _S
                    + r"*=" + _S + r"*(?:(?:old_)?password" + _S + r"*\(" + _S + r"*)?"),
    # redis MONITOR lines (1714000000.123 [0 127.0.0.1:5000] "AUTH" "X"): a command's credential, the command
    # at the command position (``_monitor_command``: so "HSET" "user:42" "auth" "oauth2", "SET" "auth" "on",
    # "DEL" "requirepass" "notes" stay): AUTH [user] X (X its last argument), HELLO 3 AUTH user X, MIGRATE ...
    # AUTH X / AUTH2 user X, CONFIG SET ... requirepass|masterauth X (the text is JSON: its quotes are \")
    (re.compile(r"(" + _monitor_command("auth") + r"(?:" + _S + r"+" + _MONITOR_ARG + r")?" + _S
                + r"+\\\")(?!\[REDACTED\])" + _DQ_VALUE + r"+(?=\\\"(?!" + _S + r"+\\\"))", re.I), r"\1" + MASK),
    (re.compile(r"(" + _monitor_command("hello") + _S + r"+" + _MONITOR_ARG + _S + r"+\\\"auth\\\"" + _S + r"+"
                + _MONITOR_ARG + _S + r"+\\\")(?!\[REDACTED\])" + _DQ_VALUE + r"+(?=\\\")", re.I), r"\1" + MASK),
    (re.compile(r"(" + _monitor_command("migrate") + r"(?:" + _S + r"+(?!\\\"keys\\\")" + _MONITOR_ARG
                + r"){5,7}?" + _S + r"+(?:\\\"auth\\\"|\\\"auth2\\\"" + _S + r"+" + _MONITOR_ARG + r")" + _S
                + r"+\\\")(?!\[REDACTED\])" + _DQ_VALUE + r"+(?=\\\")", re.I), r"\1" + MASK),
    (re.compile(r"(" + _monitor_command("config") + _S + r"+\\\"set\\\"(?:" + _S + r"+" + _MONITOR_ARG + _S + r"+"
                + _MONITOR_ARG + r"){0,%d}?" % MAX_MONITOR_PAIRS + _S + r"+\\\"(?:requirepass|masterauth)\\\"" + _S
                + r"+\\\")(?!\[REDACTED\])" + _DQ_VALUE + r"+(?=\\\")", re.I), r"\1" + MASK),
    # HTTP cookies: every value of a Cookie header (or curl's --cookie), the cookie's value of a Set-Cookie
    # header (not its attributes: Path=/, Expires=...); "Cookie: theme=dark" is masked too (documented)
    (re.compile(r"((?:(?<=\\[nrt])|(?<![\w-]))(?:cookie(?:\\?[\"'])?" + _S + r"*:|--cookie(?:=|" + _S + r"+))"
                + _S + r"*(?:\\?[\"'])?)(" + _COOKIE_PAIR + r"(?:" + _S + r"*;" + _S + r"*" + _COOKIE_PAIR + r")*)",
                re.I), _cookies),
    (re.compile(r"(" + _B + r"set-cookie(?:\\?[\"'])?" + _S + r"*:" + _S + r"*(?:\\?[\"'])?" + _COOKIE_NAME
                + r"=)(?!\[REDACTED\])" + _COOKIE_VALUE + r"+", re.I), r"\1" + MASK),
    # HTTP Digest authentication: its response (a hash of the password, the nonce and the request)
    (re.compile(r"(" + _B + r"digest" + _S + _LINE + r"\bresponse" + _S + r"*=" + _S + r"*(?:\\?\")?)"
                r"(?!\[REDACTED\])[0-9a-fA-F]{16,}", re.I), r"\1" + MASK),
    # Kubernetes / ECS environment pairs: name: DB_PASSWORD then value: X on the next line, or in one flow
    # mapping ({name: DB_PASS, value: X}, {"name": "DB_PASSWORD", "value": "X"}); valueFrom: stays
    *_quoted_values(_ENV_PAIR, unquoted=_NOT_LITERAL + r"(?:\\\\|[^\s\"'\\,}\]#])+"),
    # PuTTY private keys (.ppk): the Private-Lines: N lines after that header (line by line: LineRedactor)
    (re.compile(r"(" + _B + r"Private-Lines:" + _S + r"*(\d{1,4})" + _S + r"*)"
                r"((?:(?:\\r)?\\n[A-Za-z0-9+/=]{4,}(?=\\[rn]|\"|$))+)"), _ppk_lines),
]


def redact_shapes(text: str) -> str:
    """Mask everything shaped like a secret (``SECRET_SHAPES``). Only the shapes the RE2 prefilter finds
    in the text are run (each one is a Python regex pass; the prefilter is one linear-time pass)."""
    pending = sorted(_shapes_in(text))
    while pending:
        k = pending.pop(0)
        pattern, repl = SECRET_SHAPES[k]
        masked = pattern.sub(repl, text)
        if masked != text:       # a mask may make or end a later shape's match: ask again
            text, pending = masked, sorted(i for i in _shapes_in(masked) if i > k)
    return text


def looks_like_secret_value(value: str) -> bool:
    """Whether an environment variable's value could be a secret, whatever its name: at least
    ``MIN_ENV_SECRET_LEN`` characters, and not a number, time, version, IP address or network
    (300000, 10.20.0.0/16), a boolean, a path (/tmp/ssh-x/agent.1, ~/x, ./x) or a URL without user
    info (https://sso.example.com: one with a password is masked by its shape)."""
    v = value.strip()
    if len(v) < MIN_ENV_SECRET_LEN or _PLAIN_VALUE.fullmatch(v) or v.startswith(("/", "~", "./", "../")):
        return False
    if re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^@\s]*", v):
        return False
    try:
        ipaddress.ip_network(v, strict=False)
    except ValueError:
        return True
    return False


def sensitive_variable(name: str, value: str) -> bool:
    """Whether an environment variable holds a secret: by its name, one holding KEY, SECRET, TOKEN,
    PASSW, PASSPHRASE, CREDENTIAL or AUTH (not KEYBOARD, KEYCLOAK, TOKENIZERS, AUTHOR), or whose last
    part (split on _ - .) is PASS, PWD, DSN or PRIVATE (SMTP_PASS, MYSQL_PWD, SENTRY_DSN; not BYPASS,
    COMPASS, DSN_TIMEOUT, PASS_MAX_DAYS or PRIVATE_SUBNET); and by its value (``looks_like_secret_value``:
    not PWD=/home/ops, TOKENIZERS_PARALLELISM=false, SSH_AUTH_SOCK=/tmp/...). GPG_KEY is public."""
    if name.upper() in _PUBLIC_VARIABLES or not looks_like_secret_value(value):
        return False
    if _SENSITIVE_NAME.search(name):
        return True
    return _NAME_PARTS.split(name.upper().strip("_.-"))[-1] in _SENSITIVE_LAST_PARTS


def secret_values(extra: Iterable[str] = ()) -> set[str]:
    """Values of sensitive environment variables (``sensitive_variable``) plus ``extra`` (e.g. the
    configured API key)."""
    values = {v for k, v in os.environ.items() if sensitive_variable(k, v)}
    values.update(v for v in extra if v and len(v) >= MIN_SECRET_LEN)
    return values


def _json_form(value: str) -> str:
    """``value`` as it stands inside a JSON string (the text redacted is JSON): a quote or a backslash
    escaped, so that a password holding one is found too."""
    try:
        return orjson.dumps(value).decode()[1:-1]
    except orjson.JSONEncodeError:     # a lone surrogate (an undecodable byte of the environment)
        return value


def _known_values(extra: Iterable[str]) -> list[str]:
    """The known secret values as the JSON text (which ``redact`` works on) may hold them, longest first:
    as they are, in their JSON form (a quote or backslash escaped: the value in a text file) and JSON-escaped
    twice (the value inside a JSON file's string: "pa\\"ss" stands as pa\\\\\\"ss), and percent-encoded
    (the value in a URL or a query string an access log shows: EnvSecretVal%5F0042, p%40ss)."""
    forms = set()
    for value in secret_values(extra):
        once = _json_form(value)
        forms.update((value, once, _json_form(once)))
        for encoded in (quote(value, safe=""), quote_plus(value, safe="")):
            if encoded != value:
                forms.update((encoded, _json_form(encoded)))
    return sorted(forms, key=len, reverse=True)


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """Replace every known secret value in ``text`` (JSON text) with a mask (longest first), then every
    secret shape."""
    for value in _known_values(extra):
        if value in text:
            text = text.replace(value, MASK)
    return redact_shapes(text)


# -- line by line, as the file tools show a file -----------------------------------------------------

_PEM_MARK = re.compile(r"-----(BEGIN|END) [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# a line holding a key and a YAML block indicator (password: |): the value is on the lines after it, indented
# deeper (``LineRedactor``); _STATE_HINT finds where there may be one among the lines fed (their JSON text)
_YAML_BLOCK_KEY = re.compile(r"([ \t]*(?:-[ \t]+)?)([\"']?)([^\s:\"']+)\2[ \t]*:[ \t]+" + YAML_BLOCK_SCALAR
                             + r"[ \t]*(?:#.*)?\r?$")
_SECRET_KEY = re.compile(_SECRET_NAME + r"$", re.I)     # a key ending with a secret word (as assignments)
# a Kubernetes env entry's name line ("- name: DB_PASSWORD"): its value is on the next line ("  value: X")
_ENV_NAME_LINE = re.compile(r"[ \t]*(?:-[ \t]+)?([\"']?)name\1[ \t]*:[ \t]*([\"']?)([\w.-]{1,120})\2[ \t]*,?[ \t]*"
                            r"(?:#.*)?\r?$", re.I)
# the value line after it: the value, quoted or not (a quoted one to its closing quote)
_ENV_VALUE_LINE = re.compile(r"([ \t]*([\"']?)value\2[ \t]*:[ \t]*)(?:\"((?:\\.|[^\"\\])+)\"|'([^']+)'|"
                             r"(?!(?:null|nil|~|true|false|None)[ \t]*(?:#|$))([^\s\"'#][^\s#]*))", re.I)
# a PuTTY key's header of its private lines, and one of those lines (base64)
_PPK_HEADER = re.compile(r"[ \t]*Private-Lines:[ \t]*(\d{1,4})[ \t]*\r?$")
_BASE64_LINE = re.compile(r"[ \t]*[A-Za-z0-9+/=]{4,}[ \t]*\r?")
# where a state that runs from one line to the next may start among the lines fed (their JSON text, each line
# after a b'\n  "': a tab in it is the escape \t, a quote \"): the line of a key with a YAML block value
# (_YAML_BLOCK_KEY: key: |), a Kubernetes env entry's name line (_ENV_NAME_LINE: - name: X) and a PuTTY key's
# Private-Lines: header (_PPK_HEADER), each first on its line (after indentation, a YAML list's "- ", a quote),
# as those patterns need. One RE2 pass (a DFA: about 0.3 ms a MiB): an ordinary log, whose lines hold
# hostname:, username:, "name": or a ": >" further on, never takes the line-by-line path
_STATE_HINT = re2.compile(rb'\n  "(?: |\\t)*(?:Private-Lines:|(?:-(?: |\\t)+)?(?:\\"|\')?(?:[Nn][Aa][Mm][Ee]'
                          rb'(?:\\"|\')?(?: |\\t)*:|[^\s:"\']+(?:\\"|\')?(?: |\\t)*:(?: |\\t)+[|>]))')


def state_may_start(data: bytes) -> bool:
    """Whether a state that runs over lines (a YAML block value, a Kubernetes env entry's value line, a PuTTY
    key's private lines) may start among the lines of ``data`` (``orjson.dumps(lines, option=OPT_INDENT_2)``):
    true for every line where ``LineRedactor._block_starts`` starts one (and maybe more)."""
    return _STATE_HINT.search(data) is not None


SHAPES_FILTER = PatternFilter([pattern for pattern, _ in SECRET_SHAPES])
SHAPES_PREFILTER = SHAPES_FILTER.any


def _shapes_in(text: str) -> frozenset[int]:
    """Indexes of the shapes that may match in ``text``."""
    return SHAPES_FILTER.which(text)


class LineRedactor:
    """The lines of one text file as the tools show them: each line redacted on its own (as ``redact``
    does, known values then ``SECRET_SHAPES``), and every line of a PEM private-key block masked, from
    its BEGIN line to its END line; and the lines of a YAML block value under a secret key (``password: |``
    then the lines indented deeper than the key). The line count never changes.

    Feed the lines in file order (``changes``/``lines``, any number of calls). ``mid_file``: the
    first lines fed may be inside a key block whose BEGIN line was not read (the tail of a log); an END
    line before any BEGIN line then masks the lines before it.
    """

    def __init__(self, extra: Iterable[str] = (), *, mid_file: bool = False) -> None:
        self._values = _known_values(extra)
        self._needles = [v.encode("utf-8", "surrogatepass") for v in self._values]
        self.in_key = False
        self._unknown_start = mid_file
        self._block_indent: int | None = None     # in a YAML block value: its key's indentation
        self._env_value_next = False              # the line before was an env entry's secret name
        self._ppk_left = 0                        # lines of a PuTTY key's private block still to come

    def restart(self) -> None:
        """The next lines are the start of another file."""
        self.in_key = self._unknown_start = self._env_value_next = False
        self._block_indent = None
        self._ppk_left = 0

    def lines(self, lines: list[str]) -> list[str]:
        """``lines`` as shown."""
        changed = self.changes(lines)
        return [changed.get(i, line) for i, line in enumerate(lines)] if changed else lines

    def changes(self, lines: list[str]) -> dict[int, str]:
        """{index: the line as shown} for the lines that redaction changes (the others are shown as they are)."""
        if not lines:
            return {}
        # each line in its JSON form (the form ``redact`` works on) on a line of its own: orjson escapes
        # every newline inside a string, so line k of ``lines`` is what follows b"\n" number k + 1 of
        # ``data`` (nothing to parse: splitting the compact form on '","' took the '\","' that ends a
        # line such as '{"user": "app",' for a separator, and looped forever)
        data = orjson.dumps(lines, option=orjson.OPT_INDENT_2)
        candidates = self._candidates(data, len(lines))
        if self._unknown_start:
            self._unknown_start = False
            self.in_key = self._starts_in_key(lines)
        out: dict[int, str] = {}
        if (self.in_key or b"PRIVATE KEY" in data or self._block_indent is not None or self._env_value_next
                or self._ppk_left or state_may_start(data)):   # a key block, a YAML block value,
            # an env entry's value on the line after its name, a PuTTY key's private lines: a state
            for i, line in enumerate(lines):             # that runs through every line
                shown = self._in_block(line)
                if shown is None:
                    shown = line
                    if self.in_key or i in candidates or "PRIVATE KEY" in line:
                        shown = self._line(line)
                    self._block_starts(line)
                if shown != line:
                    out[i] = shown
            return out
        for i in sorted(candidates):
            shown = self._scrub(lines[i])
            if shown != lines[i]:
                out[i] = shown
        return out

    def _candidates(self, data: bytes, count: int) -> set[int]:
        """Indexes of the ``count`` lines of ``data`` (``orjson.dumps(lines, option=OPT_INDENT_2)``) a known
        value or a secret shape may touch: a superset of those redaction changes."""
        spans: list[tuple[int, int]] = []       # [start, end) of each match, never empty
        pos = 0
        while (m := SHAPES_PREFILTER.search(data, pos)) is not None:
            spans.append((m.start(), max(m.end(), m.start() + 1)))
            end_of_line = data.find(b"\n", spans[-1][1] - 1)
            if end_of_line < 0:
                break
            pos = end_of_line + 1      # the next line: past the match's start, so the loop always advances
        for needle in self._needles:
            at = data.find(needle)
            while at >= 0:
                spans.append((at, at + len(needle)))
                at = data.find(needle, at + 1)
        found: set[int] = set()
        # byte x is in line (b"\n" in data[:x]) - 1: the b"\n" after a line's text is part of that line
        before = counted_to = 0          # b"\n" in data[:counted_to]
        for start, end in sorted(spans):
            before += data.count(b"\n", counted_to, start)
            counted_to = start
            first, last = before - 1, before + data.count(b"\n", start, end - 1) - 1
            found.update(range(max(first, 0), min(last, count - 1) + 1))
        return found

    def _in_block(self, line: str) -> str | None:
        """``line`` as shown when it is part of a YAML block value, the value line of a Kubernetes env entry
        whose name is a secret's, or one of a PuTTY key's private lines (``None`` if not)."""
        if self._ppk_left:
            if _BASE64_LINE.fullmatch(line):
                self._ppk_left -= 1
                indent = len(line) - len(line.lstrip(" \t"))
                return line[:indent] + MASK
            self._ppk_left = 0
        if self._env_value_next:
            if not line.strip():
                return line      # a blank line between the name and the value
            self._env_value_next = False
            m = _ENV_VALUE_LINE.match(line)
            if m is not None:
                group = next(g for g in (3, 4, 5) if m.group(g) is not None)
                if m.group(group) != MASK:
                    return self._scrub(line[:m.start(group)]) + MASK + self._scrub(line[m.end(group):])
        if self._block_indent is None:
            return None
        if not line.strip():
            return line          # a blank line inside the value
        indent = len(line) - len(line.lstrip(" "))
        if indent > self._block_indent:
            return line[:indent] + MASK
        self._block_indent = None
        return None

    def _block_starts(self, line: str) -> None:
        """When ``line`` is a secret key with a YAML block value (``password: |``), its lines follow; when it is
        a Kubernetes env entry's secret name (``- name: DB_PASSWORD``), its value line; when it is a PuTTY
        key's ``Private-Lines: N``, its N private lines."""
        if self.in_key or ":" not in line:
            return
        if "ame" in line or "AME" in line:
            m = _ENV_NAME_LINE.match(line)
            if m is not None and _SECRET_KEY.search(m.group(3)):
                self._env_value_next = True
                return
        if "Private-Lines" in line:
            m = _PPK_HEADER.match(line)
            if m is not None:
                self._ppk_left = min(int(m.group(1)), MAX_PPK_LINES)
                return
        m = _YAML_BLOCK_KEY.match(line)
        if m and _SECRET_KEY.search(m.group(3)):
            self._block_indent = len(m.group(1))

    @staticmethod
    def _starts_in_key(lines: list[str]) -> bool:
        for line in lines:
            if "PRIVATE KEY" in line:
                m = _PEM_MARK.search(line)
                if m:
                    return m.group(1) == "END"
        return False

    def _line(self, line: str) -> str:
        """One line, with the key-block state (which it updates)."""
        if not self.in_key and "PRIVATE KEY" not in line:
            return self._scrub(line)
        parts, pos = [MASK] if self.in_key else [], 0
        for m in _PEM_MARK.finditer(line):
            if m.group(1) == "BEGIN" and not self.in_key:
                parts += [self._scrub(line[pos:m.start()]), MASK]
                self.in_key = True
            elif m.group(1) == "END" and self.in_key:
                self.in_key, pos = False, m.end()
        if not self.in_key:
            parts.append(self._scrub(line[pos:]))
        return "".join(parts)

    def _scrub(self, text: str) -> str:
        """``redact`` of one piece of a line, on its JSON form (the form ``redact`` works on)."""
        if not text:
            return text
        inner = orjson.dumps(text).decode()[1:-1]
        out = inner
        for value in self._values:
            if value in out:
                out = out.replace(value, MASK)
        out = redact_shapes(out)
        if out == inner:
            return text
        try:
            return orjson.loads(f'"{out}"')
        except orjson.JSONDecodeError:
            return MASK

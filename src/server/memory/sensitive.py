"""Does a text name or hold a secret?

What long-term memory never keeps and the offline agent never repeats back: a sentence that names a
password, PIN, token, key, credential or ID document, in English or Chinese (``_SECRET``), gives an
account with what it logs in with ("db-1 root / hunter2", "root 用 hunter2 登录": ``_credential_pair``), or
holds a value shaped like one whatever the words around it: the shapes ``server.tools.secrets`` masks in
tool output, a long random token (``RANDOM_TOKEN_CHARS``) or a card, ID or social security number
(``LONG_DIGITS``).
"""
from __future__ import annotations

import re

from server.tools.secrets import redact_shapes

_SECRET = re.compile(r"(?:password|passwd|pass ?phrase|passcode|secret|token|api[ _-]?key|credential|\bcreds?\b|"
                     r"(?:private|access|signing)[ _-]?key|\bpass\s*(?:is\b|[:=])|"
                     # a key that is itself the secret: "the VPN PSK", "pre-shared key", "unseal key",
                     # "recovery key/code", "master/encryption/licence/wifi key" (not "the key point",
                     # "primary key", "ssh key": ``_KEY_VALUE`` judges "<x> key is <value>" by the value)
                     r"(?<![A-Za-z])psk(?![A-Za-z])|pre[ _-]?shared[ _-]?key|"
                     r"(?<![A-Za-z])(?:unseal|recovery|master|encryption|decryption|licen[cs]e|product|"
                     r"activation|wi-?fi|wpa2?|wep|auth)[ _-]?keys?(?![A-Za-z])|(?<![A-Za-z])recovery[ _-]?codes?\b|"
                     r"(?<![A-Za-z])(?:pwd|pw|(?-i:PIN)|pin\s*(?:code|number)|ssn|cvv2?|cvc|iban)(?![A-Za-z])|"
                     r"social security|security code|(?:credit|debit|bank)[ -]?card|card\s*(?:number|no\b)|"
                     r"bank\s*account|routing\s*number|passport\s*(?:number|no\b)|"
                     r"密码|口令|密钥|秘钥|凭证|凭据|私钥|令牌|验证码|授权码|助记词|身份证|卡号|银行卡|信用卡|储蓄卡|"
                     r"安全码|社保号|护照号)", re.IGNORECASE)
#: numbers shaped like a card, an ID or a social security number are secrets whatever the words
#: around them: a run of this many digits or more (an 18-character Chinese ID may end in X), digit
#: groups of 3 to 6 ("4111 1111 1111 1111", "4111-1111-1111-1111") of as many digits that pass the
#: Luhn check of card numbers, and "078-05-1120". Not a phone number ("13800138000", "+86 138 0013
#: 8000", "555-0100"), a port, a version or an address
LONG_DIGITS = 13
_DIGIT_RUN = re.compile(r"(?<![\d+.-])\d+(?:[ -]\d+)*(?:[Xx](?![A-Za-z]))?")
_SSN = re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])")
#: a value that looks like a key or token whatever the words around it: a run of this many letters
#: and digits (``_`` ``+`` ``=`` between them) that changes between upper case, lower case and digits
#: at least every third character ("Zx81kQ...", "8f3a9c2b..."; not "ProductionCluster2024" nor a
#: hyphenated host name)
RANDOM_TOKEN_CHARS = 20
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_+=]{%d,}" % RANDOM_TOKEN_CHARS)


def _looks_random(run: str) -> bool:
    kinds = ["d" if c.isdigit() else "u" if c.isupper() else "l" for c in run if c.isalnum()]
    changes = sum(a != b for a, b in zip(kinds, kinds[1:]))
    return "d" in kinds and len(set(kinds)) > 1 and changes >= len(kinds) // 3


def _luhn(digits: str) -> bool:
    total = sum(int(d) if n % 2 == 0 else (2 * int(d) - 9 if int(d) > 4 else 2 * int(d))
                for n, d in enumerate(reversed(digits)))
    return total % 10 == 0


def _id_number(text: str) -> bool:
    """The text holds a card, ID or social security number (``LONG_DIGITS``)."""
    for run in _DIGIT_RUN.findall(text):
        groups = re.split(r"[ -]", run.rstrip("Xx"))
        digits = "".join(groups)
        if len(digits) < LONG_DIGITS:
            continue
        if len(groups) == 1 or (len(groups) >= 3 and all(3 <= len(g) <= 6 for g in groups) and _luhn(digits)):
            return True
    return _SSN.search(text) is not None


#: an account and what it logs in with, worded without a keyword (``_credential_pair``): "db-1 root /
#: hunter2", "admin:admin", "login: bob / hunter2", "the db-1 login is bob:hunter2", "log in as root with
#: hunter2", "root logs in with hunter2", "db-1 的 root 用 hunter2 登录", "账号 root / hunter2". Not an
#: ordinary ops fact: a path ("/var/log", "/root/.ssh"), "host:port", "10.0.0.1:5432", an owner
#: ("owned by root:wheel", "chown root:root"), "user root owns the file", "db-1 的端口是 5432", "用 root 登录"
#: and "jenkins 用 deploy账号登录" (the account alone), "root 用 ssh 登录" (a way of logging in, ``_LOGIN_MEANS``)
_ACCOUNT = r"(?:root|admin|administrator|superuser|sysadmin)"
_ACCOUNT_WORD = r"(?:user(?:\s?name)?|login|log-in|account|acct|账号|帐号|账户|用户名?|登录名|登录账号|登陆)"
#: what one logs in with that is no secret: "root 用 ssh 登录", "log in as root with SSO"
_LOGIN_MEANS = (r"(?:ssh|sso|ldap|saml|oauth2?|oidc|kerberos|kinit|ad|google|github|gitlab|okta|azure|keycloak|"
                r"(?:ssh[ -]?)?keys?|certs?|certificates?|mfa|2fa|otp|yubikey|the\b|a\b|an\b|my\b|our\b|your\b|"
                r"his\b|her\b|their\b|its\b)(?![\w.-])")
_PAIR_SEP = r"(?:\s*/\s*|:)"          # "root / hunter2", "root/hunter2", "root:hunter2" (no space: "root: ..." is a label)
_CREDENTIAL = re.compile(
    # "<account> / <word>", "<account>:<word>": not inside a path or an address, the word not a path
    rf"(?<![\w/.~:@-]){_ACCOUNT}{_PAIR_SEP}(?![/\s])[^\s/:]++(?![/:])|"
    # "<account word> [:=] <name> / <word>" ("login: bob / hunter2", "user bob:hunter2", "账号 root / hunter2")
    rf"(?<![\w/.-]){_ACCOUNT_WORD}(?:\s+(?:is|for\s+\S+\s+is|of\s+\S+\s+is|on\s+\S+\s+is|to\s+\S+\s+is))?"
    rf"\s*[:：=]?\s*[\w.@-]++{_PAIR_SEP}(?![/\s])[^\s/:]++(?![/:])|"
    # "log in as root with <word>", "root logs in with <word>"
    rf"\blog(?:s|ged|ging)?[\s-]?in\s+as\s+\S+\s+(?:with|using)\s+(?!{_LOGIN_MEANS})\S|"
    rf"(?<![\w/.-]){_ACCOUNT}\s+(?:logs?|logged)[\s-]?in\s+(?:with|using)\s+(?!{_LOGIN_MEANS})\S|"
    # "<account or name> 用 <word> 登录" (the word Latin: "用 ldap 登录" and "用 root 登录" aside)
    rf"(?:(?<![A-Za-z0-9_.-])[A-Za-z][A-Za-z0-9_.-]{{0,63}}+|账号|帐号|用户)\s*(?:账号|帐号|用户)?\s*(?:用|使用|以)\s*"
    rf"(?!{_LOGIN_MEANS}|{_ACCOUNT}(?![\w.-]))[A-Za-z0-9][^\s，,。]{{0,63}}?(?<!账号)(?<!帐号)(?<!用户)(?<!身份)\s*(?:来)?(?:登录|登陆|登入|login)",
    re.IGNORECASE)
#: "<x> key is <value>" and "<service> auth is/是 <value>" (Redis's AUTH) hold a secret when the value
#: looks like one: a run of at least this many letters and digits (``+/=`` among them) with both, or
#: any other characters of a password ("P4ssw0rd!"); not "the primary key is id", "the partition key is
#: tenant-42", "the redis key is user:123", "auth is LDAP", "auth: OAuth2" (``_LOGIN_MEANS``)
KEY_VALUE_CHARS = 6
_KEY_VALUE = re.compile(r"(?:(?<![A-Za-z])keys?|(?<![A-Za-z])auth)\s*(?:is|are|was|=|:|：|是|为|為)\s*"
                        r"(?P<value>[^\s，,。；;、]{1,128})", re.IGNORECASE)
_PASSWORD_SIGN = re.compile(r"[!#$%^&*+=]")
_WORDLIKE = re.compile(r"[A-Za-z]+(?:[-_][A-Za-z0-9]+)*|[A-Za-z0-9]+(?:[-_.:/][A-Za-z0-9]+)+")
_PORT = re.compile(r":\d{1,5}$")         # "admin:8080": a host and its port
#: a pair "<user>:<group>" next to these words is an owner, not a login ("owned by root:wheel")
_OWNER = re.compile(r"\b(?:own(?:s|ed|er|ership)?|chown|chgrp|group)\b|属主|属组|所有者", re.IGNORECASE)


def _credential_pair(text: str) -> bool:
    """The text gives an account and what it logs in with (``_CREDENTIAL``), not a file's owner."""
    for m in _CREDENTIAL.finditer(text):
        pair = m.group()
        if ":" in pair and "/" not in pair and (_OWNER.search(text) or _PORT.search(pair)):
            continue
        return True
    return False


def _key_value(text: str) -> bool:
    """"<x> key is <value>" or "<service> auth is/是 <value>" with a value that looks like a key or a
    password (``KEY_VALUE_CHARS``), not a word, an identifier or a path (``_WORDLIKE``)."""
    for m in _KEY_VALUE.finditer(text):
        value = m.group("value").rstrip(".!?。！？")
        if re.fullmatch(_LOGIN_MEANS, value, re.IGNORECASE) or _WORDLIKE.fullmatch(value):
            continue
        letters = any(c.isalpha() for c in value)
        digits = any(c.isdigit() for c in value)
        if letters and digits and len(value) >= KEY_VALUE_CHARS:
            return True
        if letters and _PASSWORD_SIGN.search(value):
            return True                           # "Pa$$word", "hunter!2"
    return False


def mentions_secret(text: str) -> bool:
    """The text names a password, PIN, token, key, credential or ID document (``_SECRET``), gives an
    account with what it logs in with (``_credential_pair``: "db-1 root / hunter2", "root 用 hunter2
    登录") or holds a value shaped like one: a provider key, JWT, URL password ...
    (``server.tools.secrets``), a long random token or a card, ID or social security number
    (``LONG_DIGITS``)."""
    return bool(_SECRET.search(text)) or _credential_pair(text) or _key_value(text) or redact_shapes(text) != text or \
        _id_number(text) or any(_looks_random(run) for run in _TOKEN_RUN.findall(text))

"""Does a text name or hold a secret?

What long-term memory never keeps and the offline agent never repeats back: a sentence that names a
password, PIN, token, key, credential or ID document, in English or Chinese (``_SECRET``), or holds a
value shaped like one whatever the words around it: the shapes ``server.tools.secrets`` masks in
tool output, a long random token (``RANDOM_TOKEN_CHARS``) or a card, ID or social security number
(``LONG_DIGITS``).
"""
from __future__ import annotations

import re

from server.tools.secrets import redact_shapes

_SECRET = re.compile(r"(?:password|passwd|pass ?phrase|passcode|secret|token|api[ _-]?key|credential|\bcreds?\b|"
                     r"(?:private|access|signing)[ _-]?key|\bpass\s*(?:is\b|[:=])|"
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


def mentions_secret(text: str) -> bool:
    """The text names a password, PIN, token, key, credential or ID document (``_SECRET``) or holds a
    value shaped like one: a provider key, JWT, URL password ... (``server.tools.secrets``), a long
    random token or a card, ID or social security number (``LONG_DIGITS``)."""
    return bool(_SECRET.search(text)) or redact_shapes(text) != text or _id_number(text) or \
        any(_looks_random(run) for run in _TOKEN_RUN.findall(text))

"""Defence in depth: scrub secret values (API keys, tokens, passwords) out of tool output.

The tools never read environment variables or config values, but a log file or a process could
still echo one. Every result passes through ``redact`` before it reaches the model or a client:
first the known values (sensitive environment variables, the configured API key), then anything
shaped like a secret (``SECRET_SHAPES``): provider API keys (``sk-...``, ``AKIA...``, ``ghp_...``,
``xox?-...``, ``AIza...``, ``glpat-...``), JWTs, ``Bearer``/``Basic`` credentials, the password of a
URL (``scheme://user:PASSWORD@host``), PEM private-key blocks, and the value of ``password=``,
``token: ``, ``api_key=``, ``secret=`` style assignments. The result is JSON text, so a value never
runs over a quote or a backslash and the mask keeps the JSON valid.
"""
from __future__ import annotations

import os
import re
from typing import Iterable

_SENSITIVE_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
MIN_SECRET_LEN = 6
MASK = "[REDACTED]"


# A word start: a \b, or right after a JSON escape such as \n (whose "n" would hide the boundary).
_B = r"(?:(?<=\\[nrt])|(?<!\w))"
_V = r"[^\s\"'\\,;&<>]"   # a character of a secret value (never a quote, backslash or separator)
SECRET_SHAPES: list[tuple[re.Pattern[str], str]] = [
    # PEM private keys: the whole block (JSON text holds its newlines as \n)
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)", re.S),
     MASK),
    # scheme://user:password@host -> scheme://user:[REDACTED]@host
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@\"'\\]*:)[^\s@/\"'\\]+(@)"), r"\1" + MASK + r"\2"),
    # Authorization: Bearer / Basic / Token credentials
    (re.compile(r"(\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{8,}", re.I), r"\1" + MASK),
    # provider key formats and JWTs
    (re.compile(_B + r"(?:sk|pk|rk)-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(_B + r"(?:AKIA|ASIA)[A-Z0-9]{16}\b"), MASK),
    (re.compile(_B + r"(?:gh[pousr]_[A-Za-z0-9]{30,}\b|github_pat_[A-Za-z0-9_]{30,})"), MASK),
    (re.compile(_B + r"glpat-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(_B + r"xox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(_B + r"AIza[A-Za-z0-9_-]{35}\b"), MASK),
    (re.compile(_B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),
    # name = value assignments (password=..., "token": "...", api_key: ...)
    # (the name must END with the secret word: max_tokens, token_count or auth_mode are not secrets)
    (re.compile(r"(" + _B + r"[\w.-]*?(?:passw(?:or)?d|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
                r"private[_-]?key|credentials?)(?![\w])(?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?)"
                r"(?!\[REDACTED\]|(?:Bearer|Basic|Token)\s)" + _V + r"{4,}", re.I),
     r"\1" + MASK),
]


def redact_shapes(text: str) -> str:
    """Mask everything shaped like a secret (``SECRET_SHAPES``)."""
    for pattern, repl in SECRET_SHAPES:
        text = pattern.sub(repl, text)
    return text


def secret_values(extra: Iterable[str] = ()) -> set[str]:
    """Values of sensitive-looking environment variables plus ``extra`` (e.g. the configured API key)."""
    values = {v for k, v in os.environ.items() if _SENSITIVE_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    values.update(v for v in extra if v and len(v) >= MIN_SECRET_LEN)
    return values


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """Replace every known secret value in ``text`` with a mask (longest first), then every secret shape."""
    for value in sorted(secret_values(extra), key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return redact_shapes(text)

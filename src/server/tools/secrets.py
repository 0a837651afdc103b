"""Defence in depth: scrub secret values (API keys, tokens, passwords) out of tool output.

The tools never read environment variables or config values, but a log file or a process could
still echo one. Every result passes through ``redact`` before it reaches the model or a client.
"""
from __future__ import annotations

import os
import re
from typing import Iterable

_SENSITIVE_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
MIN_SECRET_LEN = 6
MASK = "[REDACTED]"


def secret_values(extra: Iterable[str] = ()) -> set[str]:
    """Values of sensitive-looking environment variables plus ``extra`` (e.g. the configured API key)."""
    values = {v for k, v in os.environ.items() if _SENSITIVE_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    values.update(v for v in extra if v and len(v) >= MIN_SECRET_LEN)
    return values


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """Replace every known secret value in ``text`` with a mask (longest first)."""
    for value in sorted(secret_values(extra), key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text

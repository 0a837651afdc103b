"""The base of the server's config sections: ConfigError naming the dotted key, and shared checks.

Every section is a pydantic model (``protocol.settings.Settings``): each setting and its default are
written once, as a field. ``section`` is the section's dotted name in the config file; a bad value
raises ``ConfigError("server.port", "expected an integer in 0..65535, got 'x'")``.
"""
from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import AfterValidator

from protocol.settings import Invalid, Settings, dotted

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class Section(Settings):
    """A config section of the server; errors are ConfigError with ``section`` before the key."""

    section: ClassVar[str] = ""

    @classmethod
    def error(cls, key: str, message: str) -> Exception:
        return ConfigError(dotted(cls.section, key) or "config", message)


def _digest(v: str) -> str:
    if not _SHA256_RE.fullmatch(v.lower()):
        raise Invalid("expected 64 hex digits (see `nplt-server hash-token TOKEN`)")
    return v.lower()


#: a token's sha256 (``token_sha256`` keys), kept as 64 lower-case hex digits
TokenDigest = Annotated[str, AfterValidator(_digest)]

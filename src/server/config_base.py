"""Shared helpers for config sections: precise validation errors and typed field readers.

Every config section is a dataclass with ``from_dict(d) -> Self``; these helpers make the error
messages uniform: ``[section] key: expected ..., got ...``.
"""
from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def check_keys(section: str, d: dict, allowed: set[str]) -> None:
    """Reject unknown keys so typos are reported instead of silently ignored."""
    if not isinstance(d, dict):
        raise ConfigError(section, f"expected a table, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(allowed))})")


def get_int(section: str, d: dict, key: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{section}.{key}", f"expected an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(f"{section}.{key}", f"expected a value in {lo}..{hi}, got {v}")
    return v


def get_float(section: str, d: dict, key: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{section}.{key}", f"expected a number, got {v!r}")
    v = float(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(f"{section}.{key}", f"expected a value in {lo}..{hi}, got {v}")
    return v


def get_bool(section: str, d: dict, key: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{section}.{key}", f"expected true or false, got {v!r}")
    return v


def get_str(section: str, d: dict, key: str, default: str | None, choices: tuple[str, ...] | None = None) -> Any:
    v = d.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str):
        raise ConfigError(f"{section}.{key}", f"expected a string, got {v!r}")
    if choices is not None and v not in choices:
        raise ConfigError(f"{section}.{key}", f"expected one of {', '.join(choices)}, got {v!r}")
    return v


def get_str_list(section: str, d: dict, key: str, default: list[str]) -> list[str]:
    v = d.get(key, default)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{section}.{key}", f"expected a list of strings, got {v!r}")
    return list(v)

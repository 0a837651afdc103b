"""Human-meaningful units for tool results, and the error type tools raise."""
from __future__ import annotations

from typing import Any

import orjson


class ToolFailure(Exception):
    """A tool could not do what was asked; the message goes back to the model as the result."""


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; bytes are shown as integers."""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def fmt_duration(seconds: float) -> str:
    """93784 -> '1d 2h 3m'; under a minute -> '42s'."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if not (days or hours or minutes):
        return f"{s}s"
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    parts.append(f"{minutes}m")
    return " ".join(parts)


def pct(value: float) -> float:
    """Percentages rounded to one decimal."""
    return round(float(value), 1)


def to_json(obj: Any) -> str:
    """Compact JSON text (UTF-8 kept readable, non-str keys allowed). A text that is not valid UTF-8
    (a file name with undecodable bytes, as ``os`` decodes it) is shown with ``\\xNN`` escapes, as
    ``ls -b`` does, instead of failing the whole result."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return orjson.dumps(displayable(obj), option=orjson.OPT_NON_STR_KEYS).decode()


def displayable(obj: Any) -> Any:
    """``obj`` with every str that holds lone surrogates escaped (recursively in dicts, lists, tuples)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            try:
                return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:           # a surrogate no undecodable byte gives
                return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, dict):
        return {displayable(k): displayable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [displayable(v) for v in obj]
    return obj

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


def fmt_duration(seconds: float, units: tuple[str, str, str, str] = ("d", "h", "m", "s")) -> str:
    """93784 -> '1d 2h 3m'; under a minute -> '42s'. ``units``: the suffixes of days, hours, minutes
    and seconds (" 天", " 小时", " 分钟", " 秒" say it in Chinese)."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    d, h, m, sec = units
    if not (days or hours or minutes):
        return f"{s}{sec}"
    parts = [f"{days}{d}"] if days else []
    if days or hours:
        parts.append(f"{hours}{h}")
    parts.append(f"{minutes}{m}")
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


CUT = "…"          # ends a text that fit_json cut
MIN_TEXT_CHARS = 64   # fit_json cuts lists rather than texts below this


def _shrink(value: Any, chars: int, items: int) -> Any:
    """``value`` with every text longer than ``chars`` cut (marked with CUT) and every list cut to ``items``."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + CUT
    if isinstance(value, list):
        return [_shrink(v, chars, items) for v in value[:items]]
    if isinstance(value, dict):
        return {k: _shrink(v, chars, items) for k, v in value.items()}
    return value


def _longest(lo: int, hi: int, fits: Any) -> int | None:
    """The largest n in lo..hi with ``fits(n)`` (``fits`` is monotonic), or None."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def fit_json(text: str, limit: int) -> str:
    """The JSON document ``text`` made to fit in ``limit`` characters (``tools.max_result_chars``), still
    JSON and never re-encoded as a string: its texts are cut to one common length (marked with CUT), and
    if that would leave less than MIN_TEXT_CHARS of them, its lists are cut instead. The result says so:
    ``"truncated": true`` and ``"cut": {"max_result_chars", "texts_cut_to", "lists_cut_to"?}``. A
    result that cannot fit even then becomes an error naming the limit."""
    if len(text) <= limit:
        return text
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = text
    if not isinstance(value, dict):
        value = {"partial": value}
    value = {k: v for k, v in value.items() if k not in ("truncated", "cut")}

    def render(chars: int, items: int | None) -> str:
        cut: dict[str, Any] = {"max_result_chars": limit, "texts_cut_to": chars}
        if items is not None:
            cut["lists_cut_to"] = items
        kept = _shrink(value, chars, len(text) if items is None else items)
        return to_json({"truncated": True, "cut": cut, **kept})

    chars = _longest(MIN_TEXT_CHARS, len(text), lambda n: len(render(n, None)) <= limit)
    if chars is not None:
        return render(chars, None)
    items = _longest(0, len(text), lambda n: len(render(MIN_TEXT_CHARS, n)) <= limit)
    if items is not None:
        return render(MIN_TEXT_CHARS, items)
    return to_json({"truncated": True, "error": f"the result was too large to show ({len(text)} characters; "
                                                f"tools.max_result_chars is {limit}): ask for less"})

"""Argument parsing and validation against the small JSON-schema subset the tools use.

Supported: an object with ``properties``, ``required`` and ``additionalProperties: false``; property
types string (minLength, maxLength, enum), integer and number (minimum, maximum), boolean; ``default``.
Error messages are written for the model so it can correct its call.
"""
from __future__ import annotations

from typing import Any

import orjson

RAW_ARGUMENTS = "_raw_arguments"   # key under which unparseable argument text is kept in a ToolCall


class ArgumentError(ValueError):
    """The arguments of a tool call are malformed or violate the tool's schema."""


def parse_arguments(arguments: str | dict | None) -> dict[str, Any]:
    """JSON text or dict -> dict; empty text means no arguments. Raises ArgumentError."""
    if arguments is None:
        return {}
    if isinstance(arguments, dict):
        return dict(arguments)
    if not isinstance(arguments, str):
        raise ArgumentError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    text = arguments.strip()
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ArgumentError(f"arguments are not valid JSON ({e}); send a JSON object such as {{\"key\": \"value\"}}") from None
    if not isinstance(value, dict):
        raise ArgumentError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def lenient_arguments(arguments: str | dict | None) -> dict[str, Any]:
    """Best-effort dict for the ToolCall record: parsed when possible, else the raw text kept."""
    try:
        return parse_arguments(arguments)
    except ArgumentError:
        return {RAW_ARGUMENTS: str(arguments)[:2000]}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _range_text(spec: dict[str, Any]) -> str:
    lo, hi = spec.get("minimum"), spec.get("maximum")
    if lo is not None and hi is not None:
        return f" in {lo}..{hi}"
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


def _check(name: str, value: Any, spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    where = f"argument '{name}'"
    if "enum" in spec and value not in spec["enum"]:
        allowed = ", ".join(repr(v) for v in spec["enum"])
        raise ArgumentError(f"{where}: expected one of {allowed}, got {value!r}")
    if kind == "string":
        if not isinstance(value, str):
            raise ArgumentError(f"{where}: expected a string, got {_type_name(value)} {value!r}")
        if len(value) < spec.get("minLength", 0):
            raise ArgumentError(f"{where}: expected at least {spec['minLength']} character(s), got {len(value)}")
        if "maxLength" in spec and len(value) > spec["maxLength"]:
            raise ArgumentError(f"{where}: expected at most {spec['maxLength']} characters, got {len(value)}")
        return value
    if kind in ("integer", "number"):
        if isinstance(value, float) and kind == "integer" and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) if kind == "integer" else isinstance(value, (int, float))
        noun = "an integer" if kind == "integer" else "a number"
        if isinstance(value, bool) or not ok:
            raise ArgumentError(f"{where}: expected {noun}{_range_text(spec)}, got {_type_name(value)} {value!r}")
        lo, hi = spec.get("minimum"), spec.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ArgumentError(f"{where}: expected {noun}{_range_text(spec)}, got {value!r}")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ArgumentError(f"{where}: expected true or false, got {_type_name(value)} {value!r}")
        return value
    return value


def validate(schema: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """Check ``args`` against an object schema; returns a new dict with defaults filled in."""
    props: dict[str, Any] = schema.get("properties", {})
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(args) - set(props))
        if unknown:
            allowed = ", ".join(props) or "none"
            raise ArgumentError(f"unknown argument '{unknown[0]}' (allowed: {allowed})")
    for name in schema.get("required", ()):
        if name not in args or args[name] is None:
            raise ArgumentError(f"missing required argument '{name}'")
    out: dict[str, Any] = {}
    for name, spec in props.items():
        if name in args and args[name] is not None:
            out[name] = _check(name, args[name], spec)
        elif "default" in spec:
            out[name] = spec["default"]
    return out

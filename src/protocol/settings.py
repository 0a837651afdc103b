"""The one config validator: pydantic models whose errors name the dotted key and what was expected.

Not part of the wire format: it sits in ``protocol`` because protocol is the one package that storage,
server and client may all import (``protocol/__init__`` does not import it, so the codec does not
load pydantic). A config section subclasses :class:`Settings` and declares each setting once, with
its default and its range: ``port: int = Field(9999, ge=0, le=65535)``. Types are strict (a TOML
string is not a number, ``true`` is not an integer) and unknown keys are refused.
``Section.from_dict(table)`` raises the layer's own error, ``cls.error(key, message)``, with the pair
that :func:`explain` makes from pydantic's ValidationError, e.g. ``("port", "expected an integer in
0..65535, got 'x'")``. Rules pydantic cannot state (cross-key rules, files read at load) are
validators raising :class:`Invalid`.
"""
from __future__ import annotations

import re
from typing import Any, Literal, Self, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")

_EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
             "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
             "string_type": "a string", "string_too_short": "a non-empty string", "list_type": "a list",
             "tuple_type": "a list", "dict_type": "a table", "model_type": "a table"}
_OUT_OF_RANGE = ("greater_than_equal", "less_than_equal", "greater_than", "less_than")
#: keys whose values are secrets: an error about such a key says what kind of value it got, never the value
#: (a field can also be marked with ``Field(repr=False)`` or ``json_schema_extra={"secret": True}``)
SECRET_KEY_RE = re.compile(r"(?:^|_)(?:api_?key|token|password|passwd|secret|credentials?)(?:_sha256)?$", re.IGNORECASE)
_KINDS = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"),
          (dict, "a table"), ((list, tuple), "a list"))


class Invalid(ValueError):
    """Raised by a validator: ``message`` about the key at ``loc`` below the value being validated
    (``Invalid("must be less than ...", "ping_interval_s")`` in a model validator)."""

    def __init__(self, message: str, *loc: str | int) -> None:
        super().__init__(message)
        self.message, self.loc = message, loc


class Settings(BaseModel):
    """Base of every config section. Subclasses set ``error`` (how their layer reports a bad key).

    ``Section.from_dict(table)`` raises that error; building a section directly (``Section(port=1)``,
    for code and tests) raises pydantic's ValidationError, also a ValueError.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        """The section from a config table (a dict parsed from TOML)."""
        try:
            return cls.model_validate(d)
        except ValidationError as exc:
            raise cls.error(*explain(exc, cls, d)) from None

    @classmethod
    def error(cls, key: str, message: str) -> Exception:
        """The exception for a bad ``key`` (dotted, relative to this section; "" is the section)."""
        return Invalid(message, key)


def dotted(*parts: str) -> str:
    """``dotted("auth", "users[0].admin")`` -> ``auth.users[0].admin`` (empty parts are left out)."""
    out = ""
    for p in parts:
        out += ("." if out and p and not p.startswith("[") else "") + p
    return out


def explain(exc: ValidationError, model: type[BaseModel], data: Any) -> tuple[str, str]:
    """(dotted key, message) for the first error of ``exc``, raised validating ``data`` as ``model``."""
    err = exc.errors(include_url=False)[0]
    loc, kind, value = err["loc"], err["type"], err.get("input")
    cause = (err.get("ctx") or {}).get("error")
    owner, field = _lookup(model, loc)
    secret = is_secret(loc, field)
    got = redacted(value) if secret else _shown(value)
    if isinstance(cause, Invalid):
        return _path(loc + cause.loc, data), _scrub(cause.message, value) if secret else cause.message
    if kind == "extra_forbidden":
        allowed = sorted(n for name, f in (owner.model_fields.items() if owner else ()) for n in _names(name, f))
        message = f"unknown key (allowed: {', '.join(allowed)})"
    elif kind == "missing":
        message = "missing"
    elif kind == "literal_error" and field is not None:
        message = f"expected one of {', '.join(map(str, _literals(field.annotation)))}, got {got}"
    elif kind in _OUT_OF_RANGE:
        message = f"expected a value {_bounds(field)}, got {got}"
    elif kind in _EXPECTED:
        bounds = _bounds(field) if kind.startswith(("int", "float")) else ""
        message = f"expected {_EXPECTED[kind]}{' ' + bounds if bounds else ''}, got {got}"
    else:
        message = str(cause) if cause is not None else err["msg"]
        message = _scrub(message, value) if secret else message
    return _path(loc, data), message


def is_secret(loc: tuple[str | int, ...], field: FieldInfo | None) -> bool:
    """Whether the key at ``loc`` holds a secret: a key name on the way ends in a secret word
    (``SECRET_KEY_RE``: ``api_key``, ``token``, ``db_password``, ``client_secret``, ``token_sha256``;
    not ``token_budget`` or ``api_key_env``), or its field is declared ``repr=False`` or
    ``json_schema_extra={"secret": True}``."""
    if any(isinstance(p, str) and SECRET_KEY_RE.search(p) for p in loc):
        return True
    if field is None:
        return False
    extra = field.json_schema_extra
    return field.repr is False or (isinstance(extra, dict) and extra.get("secret") is True)


def redacted(value: Any) -> str:
    """What an error shows of a secret's value: its kind only, e.g. ``<a list, redacted>``."""
    kind = next((k for t, k in _KINDS if isinstance(value, t)), "a value")
    return f"<{kind}, redacted>"


def _scrub(message: str, value: Any) -> str:
    """``message`` with every string inside ``value`` (and its repr) replaced by ``<redacted>``."""
    parts: list[str] = []

    def collect(v: Any) -> None:
        if isinstance(v, str):
            if v:
                parts.extend((repr(v), v))
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)
    collect(value)
    if isinstance(value, (list, tuple, dict)):
        parts.insert(0, repr(value))
    for p in sorted(parts, key=len, reverse=True):
        message = message.replace(p, "<redacted>")
    return message


def parse_env(raw: str, typ: Any) -> Any:
    """An environment variable's text as ``typ`` (int, float, bool; else the text); Invalid if it is not."""
    text = raw.strip()
    if typ is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise Invalid(f"expected true or false, got {raw!r}")
    if typ in (int, float):
        try:
            return typ(text)
        except ValueError:
            raise Invalid(f"expected {'an integer' if typ is int else 'a number'}, got {raw!r}") from None
    return raw


def _path(loc: tuple[str | int, ...], data: Any) -> str:
    """The dotted key as the user wrote it: a list index is shown only where the input was a list
    (a single table given where a list of tables is allowed has no ``[0]``)."""
    out, here = "", data
    for part in loc:
        if isinstance(part, int):
            if isinstance(here, (list, tuple)):
                out += f"[{part}]"
                here = here[part] if part < len(here) else None
            continue
        out = dotted(out, part)
        here = here.get(part) if isinstance(here, dict) else None
    return out


def _names(name: str, f: FieldInfo) -> list[str]:
    """The keys a field is read from: its aliases (``AliasChoices``) or its name."""
    alias = f.validation_alias
    if isinstance(alias, str):
        return [alias]
    return [c for c in getattr(alias, "choices", ()) if isinstance(c, str)] or [name]


def _lookup(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model holding the key at ``loc``, and that key's field (None where there is none)."""
    owner: type[BaseModel] | None = model
    field: FieldInfo | None = None
    for i, part in enumerate(loc):
        if isinstance(part, int):
            continue
        fields = owner.model_fields.items() if owner is not None else ()
        field = next((f for n, f in fields if part in _names(n, f)), None)
        if i < len(loc) - 1:
            owner = _model_in(field.annotation) if field is not None else None
    return owner, field


def _model_in(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return next((m for a in get_args(tp) if (m := _model_in(a)) is not None), None)


def _literals(tp: Any) -> list[Any]:
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    return [v for a in get_args(tp) for v in _literals(a)]


def _bounds(field: FieldInfo | None) -> str:
    """``in 1..10``, ``in (0, 600]``, ``>= 1``, ... from the field's constraints (annotated_types Ge, Le, ...)."""
    c = {name: getattr(m, name) for m in (field.metadata if field is not None else ())
         if (name := type(m).__name__.lower()) in ("ge", "gt", "le", "lt")}
    lo, hi = c.get("ge", c.get("gt")), c.get("le", c.get("lt"))
    if lo is not None and hi is not None:
        if "ge" in c and "le" in c:
            return f"in {_num(lo)}..{_num(hi)}"
        return f"in {'[' if 'ge' in c else '('}{_num(lo)}, {_num(hi)}{']' if 'le' in c else ')'}"
    if lo is not None:
        return f"{'>=' if 'ge' in c else '>'} {_num(lo)}"
    return f"{'<=' if 'le' in c else '<'} {_num(hi)}" if hi is not None else ""


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["FALSE", "SECRET_KEY_RE", "Invalid", "Settings", "TRUE", "dotted", "explain", "is_secret", "parse_env",
           "redacted"]

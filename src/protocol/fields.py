"""Validating reads of a decoded JSON body, for the typed replies and events.

``Fields(body, path)`` wraps one JSON object. Each read either returns a value of the expected type
or raises ``ProtocolError(INVALID_MESSAGE)`` naming the field by its full path
(``field 'session.message_count': expected an integer >= 0, got 'x'``). Unknown fields are never
looked at, so they are ignored. ``optional`` reads treat an absent field and an explicit ``null`` the
same: the default is returned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar, Union

from .codes import ErrorCode
from .errors import ProtocolError

T = TypeVar("T")
RequestId = Union[int, str]

MAX_ID_CHARS = 64   # request "id" strings (docs/protocol.md §3)
MAX_INT_ID = (1 << 64) - 1   # request "id" integers are below 2^64 (docs/protocol.md §3)
_MISSING: Any = object()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def invalid(field: str, problem: str) -> ProtocolError:
    """The non-fatal INVALID_MESSAGE error for one field."""
    return ProtocolError(ErrorCode.INVALID_MESSAGE, f"field '{field}': {problem}", fatal=False)


def valid_request_id(value: Any) -> bool:
    """A request id: an integer in 0..MAX_INT_ID or a string of 1..MAX_ID_CHARS characters."""
    if isinstance(value, str):
        return 1 <= len(value) <= MAX_ID_CHARS
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT_ID


def show_id(value: Any) -> str:
    """An invalid id as an error message quotes it. A JSON integer over 2^64-1 is read as a float
    (orjson: 18446744073709551616 becomes 1.8446744073709552e+19), which is not what was sent: it is
    named "a number over 2^64-1" instead (and one below -2^63 "a negative number")."""
    if type(value) is float and value >= MAX_INT_ID or type(value) is int and value > MAX_INT_ID:
        return "a number over 2^64-1"
    if type(value) is float and value <= -(1 << 63):
        return "a negative number"
    return _show(value)


def id_problem(value: Any, field: str = "id", *, null: bool = False) -> ProtocolError:
    """The INVALID_MESSAGE error for a request id (``field`` "id", or "re", where ``null`` is allowed)
    that is not one (``valid_request_id``)."""
    expected = "null, a non-negative integer" if null else "a non-negative integer"
    return invalid(field, f"expected {expected} or a string of 1..{MAX_ID_CHARS} characters, "
                          f"got {show_id(value)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Fields:
    """Typed, validating access to the fields of one JSON object (``path`` prefixes field names)."""

    __slots__ = ("body", "path")

    def __init__(self, body: Any, path: str = "") -> None:
        if not isinstance(body, dict):
            if path:
                raise invalid(path, f"expected an object, got {_show(body)}")
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, "the body must be a JSON object", fatal=False)
        self.body: dict[str, Any] = body
        self.path = path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, optional: bool) -> Any:
        value = self.body.get(key, _MISSING)
        if value is _MISSING or value is None:
            if not optional:
                raise invalid(self.name(key), "missing (required)" if value is _MISSING else
                              "expected a value, got None")
            return _MISSING
        return value

    def _fail(self, key: str, expected: str, value: Any) -> ProtocolError:
        return invalid(self.name(key), f"expected {expected}, got {_show(value)}")

    def text(self, key: str, *, optional: bool = False, default: Any = None) -> Any:
        """A string (possibly empty)."""
        value = self._get(key, optional)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise self._fail(key, "a string", value)
        return value

    def integer(self, key: str, *, optional: bool = False, default: Any = None, lo: int = 0) -> Any:
        """An integer >= ``lo`` (booleans are not integers)."""
        value = self._get(key, optional)
        if value is _MISSING:
            return default
        if not _is_int(value) or value < lo:
            raise self._fail(key, f"an integer >= {lo}", value)
        return value

    def number(self, key: str, *, optional: bool = False, default: Any = None) -> Any:
        """An int or a float, kept as sent (so it encodes back to the same JSON)."""
        value = self._get(key, optional)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number", value)
        return value

    def flag(self, key: str, *, optional: bool = False, default: Any = False) -> Any:
        value = self._get(key, optional)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "a boolean", value)
        return value

    def mapping(self, key: str, *, optional: bool = False) -> Any:
        """A JSON object kept as a dict (open-ended objects: limits, usage, context, metadata)."""
        value = self._get(key, optional)
        if value is _MISSING:
            return {}
        if not isinstance(value, dict):
            raise self._fail(key, "an object", value)
        return value

    def obj(self, key: str, read: Callable[[Fields], T], *, optional: bool = False) -> T | None:
        """A nested object read by ``read`` (None when optional and absent or null)."""
        value = self._get(key, optional)
        if value is _MISSING:
            return None
        return read(Fields(value, self.name(key)))

    def objects(self, key: str, read: Callable[[Fields], T], *, optional: bool = False) -> tuple[T, ...]:
        """An array of objects, each read by ``read``."""
        value = self._get(key, optional)
        if value is _MISSING:
            return ()
        if not isinstance(value, list):
            raise self._fail(key, "an array", value)
        return tuple(read(Fields(item, f"{self.name(key)}[{i}]")) for i, item in enumerate(value))

    def texts(self, key: str, *, optional: bool = False) -> tuple[str, ...]:
        value = self._get(key, optional)
        if value is _MISSING:
            return ()
        if not isinstance(value, list):
            raise self._fail(key, "an array", value)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise invalid(f"{self.name(key)}[{i}]", f"expected a string, got {_show(item)}")
        return tuple(value)

    def re(self) -> RequestId | None:
        """The ``re`` field: the id of the request answered (or that caused an event), or null."""
        value = self.body.get("re")
        if value is None:
            return None
        if not valid_request_id(value):
            raise id_problem(value, self.name("re"), null=True)
        return value

    def code(self, key: str = "code") -> ErrorCode:
        """An error code of docs/protocol.md §8."""
        value = self._get(key, False)
        try:
            return ErrorCode(value)
        except ValueError:
            raise self._fail(key, "an error code of docs/protocol.md §8", value) from None


class Wire:
    """Base of the typed bodies: ``decode(body)`` validates a decoded JSON object into the class.

    Subclasses are frozen dataclasses that implement ``read(fields)`` (decoding) and ``encode()``
    (the JSON body exactly as sent on the wire).
    """

    __slots__ = ()

    @classmethod
    def read(cls, f: Fields) -> Any:  # pragma: no cover - every subclass implements it
        raise NotImplementedError

    @classmethod
    def decode(cls: type[T], body: Any) -> T:
        """Validate ``body``; ProtocolError(INVALID_MESSAGE) naming the first bad field."""
        return cls.read(Fields(body))  # type: ignore[attr-defined, no-any-return]

    def encode(self) -> dict[str, Any]:  # pragma: no cover - every subclass implements it
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Addressed(Wire):
    """Base of every reply and event: ``re`` (the request answered, or null) and ``truncated``
    (encoded only when true: the server cut the body's longest texts, or left a search's weakest
    hits out, to fit)."""
    re: RequestId | None = field(default=None, kw_only=True)
    truncated: bool = field(default=False, kw_only=True)

    def _finish(self, out: dict[str, Any]) -> dict[str, Any]:
        if self.truncated:
            out["truncated"] = True
        return out


def addressed(f: Fields) -> dict[str, Any]:
    """The keyword fields every reply and event reads the same way (``re``, ``truncated``)."""
    return {"re": f.re(), "truncated": f.flag("truncated", optional=True)}

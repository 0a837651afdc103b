"""Type and error codes match docs/protocol.md exactly; the helper sets are consistent."""
from __future__ import annotations

import re
from pathlib import Path

import protocol
from protocol import (EVENT_CODES, FATAL_CODES, REQUEST_CODES, V2_ONLY_TYPES, V2_TYPES,
                      V3_ONLY_TYPES, ErrorCode, MsgType, ProtocolError, type_name)
from protocol.messages import REQUEST_TYPES

SPEC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = SPEC.index(title)
    end = SPEC.find("\n## ", start + 1)
    return SPEC[start:end if end > 0 else len(SPEC)]


def test_every_type_code_of_the_spec_and_no_other() -> None:
    rows = re.findall(r"^\| (0x[0-9A-F]{2}) \| (\w+) \| ([^|]+) \| ([^|]+) \|",
                      _section("## 4. Type codes"), re.M)
    spec = {name: int(code, 16) for code, name, _direction, _version in rows}
    assert len(spec) == 55
    assert spec == {m.name: m.value for m in MsgType}


def test_v2_and_v3_sets_follow_the_version_column() -> None:
    rows = re.findall(r"^\| 0x[0-9A-F]{2} \| (\w+) \| [^|]+ \| ([^|]+) \|",
                      _section("## 4. Type codes"), re.M)
    v2 = {MsgType[name] for name, version in rows if "v2" in version}
    assert v2 == V2_TYPES
    assert MsgType.CLIENT_UDP_PORT in V2_TYPES
    assert V3_ONLY_TYPES == frozenset(MsgType) - V2_TYPES
    assert MsgType.HELLO in V3_ONLY_TYPES and MsgType.FRAGMENT in V3_ONLY_TYPES
    assert {MsgType[name] for name, version in rows if version.strip() == "v2"} == V2_ONLY_TYPES


def test_every_error_code_of_the_spec_with_its_fatality() -> None:
    rows = re.findall(r"^\| `([A-Z_0-9]+)` \| (yes|no) \|", _section("## 8. Errors"), re.M)
    spec = dict(rows)
    assert len(spec) == 36
    assert set(spec) == {c.value for c in ErrorCode}
    assert {ErrorCode(c) for c, fatal in spec.items() if fatal == "yes"} == FATAL_CODES
    for code in ErrorCode:
        assert ProtocolError(code, "x").fatal is (spec[code.value] == "yes")


def test_request_and_event_sets() -> None:
    assert REQUEST_CODES == frozenset(REQUEST_TYPES)
    assert not REQUEST_CODES & EVENT_CODES
    assert MsgType.PING in REQUEST_CODES and MsgType.PONG not in REQUEST_CODES
    assert all(0x30 <= code <= 0x38 or 0x40 <= code <= 0x4F for code in EVENT_CODES) and len(EVENT_CODES) == 11


def test_type_name() -> None:
    assert type_name(0x20) == "HELLO"
    assert type_name(MsgType.FRAGMENT) == "FRAGMENT"
    assert type_name(0x99) == "0x99"
    assert type_name(0x02) == "0x02"


def test_protocol_error_fields_and_repr() -> None:
    err = ProtocolError("SEQ_MISMATCH", "expected 1, got 3")
    assert err.code is ErrorCode.SEQ_MISMATCH and err.fatal and err.events == []
    assert str(err) == "SEQ_MISMATCH: expected 1, got 3"
    assert repr(err) == "ProtocolError('SEQ_MISMATCH', 'expected 1, got 3', fatal=True)"
    forced = ProtocolError(ErrorCode.INTERNAL, "boom", fatal=True, events=[1])
    assert forced.fatal and forced.events == [1]


def test_public_api_of_the_architecture_doc() -> None:
    for name in ("MsgType", "ErrorCode", "ProtocolError", "Connection", "Role", "Message",
                 "InvalidMessage", "ProtocolVersion", "split_text_utf8"):
        assert name in protocol.__all__ and hasattr(protocol, name)


def test_protocol_imports_no_io_modules() -> None:
    src = Path(protocol.__file__).parent
    for path in src.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from)\s+(asyncio|socket|selectors)\b", text, re.M), path


def _alternatives(pattern: str) -> set[str]:
    """The quoted values of ``"a" | "b" | ...`` after ``pattern`` in docs/protocol.md."""
    m = re.search(pattern + r'((?:\s*"\w+"\s*\|?)+)', SPEC)
    assert m, pattern
    return set(re.findall(r'"(\w+)"', m.group(1)))


def test_event_enumerations_match_the_spec() -> None:
    from protocol.server_events import FINISH_REASONS, SESSION_EVENT_KINDS
    assert set(SESSION_EVENT_KINDS) == _alternatives(r'`SESSION_EVENT \{"kind":')
    assert set(FINISH_REASONS) == _alternatives(r'"finish_reason":')

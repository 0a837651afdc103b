"""Typed v3 request bodies: valid bodies parse, invalid ones name the field and the problem."""
from __future__ import annotations

import pytest

from protocol import ErrorCode, InvalidMessage, Message, MsgType, ProtocolError
from protocol.messages import (REQUEST_TYPES, ChatCancel, ChatEdit, ChatRegenerate, ChatSend, ClientKill, ClientList,
                               Hello,
                               HistoryExport, HistoryPage, HistorySearch, MemoryForget, MemoryList, ModelList, ModelSwitch,
                               Ping, SessionClear, SessionDelete, SessionInfoReq, SessionList,
                               SessionNew, SessionPrompt, SessionPurge, SessionRename, SessionRestore,
                               SessionSwitch, Stats, parse_request,
                               request_id)

VALID = {
    Hello: ({"id": 0, "proto": 3, "client": "nplt-tui/0.1", "token": "t", "session_id": "s_1"},
            Hello(0, 3, "nplt-tui/0.1", "t", "s_1")),
    ChatSend: ({"id": "a", "text": "hi", "session_id": "s_1", "extra": 1}, ChatSend("a", "hi", "s_1")),
    ChatCancel: ({"id": 1, "turn_id": "t_1"}, ChatCancel(1, None, "t_1")),
    HistoryPage: ({"id": 1, "before": 40, "limit": 200}, HistoryPage(1, None, 40, 200)),
    HistorySearch: ({"id": 1, "query": "cpu"}, HistorySearch(1, "cpu", None, None)),
    HistoryExport: ({"id": 1, "format": "markdown"}, HistoryExport(1, "markdown", None)),
    SessionList: ({"id": 1, "before": "c:1", "limit": None, "deleted": True}, SessionList(1, "c:1", None, True)),
    SessionNew: ({"id": 1, "system_prompt": "Be brief."}, SessionNew(1, None, "Be brief.")),
    SessionSwitch: ({"id": 1, "session_id": "s_2"}, SessionSwitch(1, "s_2")),
    SessionRename: ({"id": 1, "title": "Disk"}, SessionRename(1, "Disk", None)),
    SessionDelete: ({"id": 1, "session_id": "s_2"}, SessionDelete(1, "s_2")),
    SessionClear: ({"id": 1, "session_id": None, "purge": True}, SessionClear(1, None, True)),
    SessionInfoReq: ({"id": 1}, SessionInfoReq(1, None)),
    ModelList: ({"id": 1, "session_id": "s_3"}, ModelList(1, "s_3")),
    ModelSwitch: ({"id": 1, "model": "gpt"}, ModelSwitch(1, "gpt", None)),
    Ping: ({"id": 99}, Ping(99)),
    Stats: ({"id": "x" * 64}, Stats("x" * 64)),
    ClientList: ({"id": 5}, ClientList(5)),
    ClientKill: ({"id": 6, "user": "bob", "peer": "127.0.0.1"}, ClientKill(6, None, "bob", "127.0.0.1")),
    SessionRestore: ({"id": 1, "session_id": "s_2"}, SessionRestore(1, "s_2")),
    SessionPurge: ({"id": 1, "session_id": "s_2"}, SessionPurge(1, "s_2")),
    SessionPrompt: ({"id": 1, "system_prompt": ""}, SessionPrompt(1, None, "")),
    ChatRegenerate: ({"id": 1, "session_id": "s_2"}, ChatRegenerate(1, "s_2")),
    ChatEdit: ({"id": 1, "message_id": 3, "text": "again"}, ChatEdit(1, 3, "again", None)),
    MemoryList: ({"id": 1}, MemoryList(1)),
    MemoryForget: ({"id": 1, "item_id": "m0a1b2c3d4e5f"}, MemoryForget(1, "m0a1b2c3d4e5f")),
}


def error_of(cls: type, body: object) -> str:
    with pytest.raises(ProtocolError) as info:
        cls.from_body(body)  # type: ignore[attr-defined]
    assert info.value.code is ErrorCode.INVALID_MESSAGE and not info.value.fatal
    return info.value.message


@pytest.mark.parametrize("cls", list(VALID))
def test_valid_bodies(cls: type) -> None:
    body, expected = VALID[cls]
    assert cls.from_body(body) == expected  # type: ignore[attr-defined]


def test_one_class_per_request_type() -> None:
    from protocol.kb import KB_REQUEST_TYPES      # tested in tests/kb_wire/test_protocol.py
    assert set(REQUEST_TYPES.values()) == set(VALID) | set(KB_REQUEST_TYPES.values())
    assert len(REQUEST_TYPES) == 33


@pytest.mark.parametrize("cls", list(VALID))
def test_every_request_checks_its_body_and_id(cls: type) -> None:
    body = dict(VALID[cls][0])
    assert error_of(cls, [body]) == "request body must be a JSON object"
    del body["id"]
    assert error_of(cls, body) == "field 'id': missing (every request carries an id)"
    for bad in (-1, True, 1.5, "", "x" * 65, None, [1]):
        message = error_of(cls, {**body, "id": bad})
        assert message.startswith("field 'id': expected a non-negative integer or a string of 1..64")
        assert message.endswith(f"got {bad!r}" if len(repr(bad)) <= 40 else "...")


@pytest.mark.parametrize("cls, body, message", [
    (HistoryPage, {"limit": "x"}, "field 'limit': expected an integer >= 1, got 'x'"),
    (HistoryPage, {"limit": 0}, "field 'limit': expected an integer >= 1, got 0"),
    (HistoryPage, {"limit": True}, "field 'limit': expected an integer >= 1, got True"),
    (HistoryPage, {"before": -1}, "field 'before': expected an integer >= 1, got -1"),
    (HistoryPage, {"before": 0}, "field 'before': expected an integer >= 1, got 0"),
    (HistoryPage, {"before": "12"}, "field 'before': expected an integer >= 1, got '12'"),
    (HistoryPage, {"session_id": 5}, "field 'session_id': expected a string of 1..128 characters, got 5"),
    (SessionList, {"before": ""}, "field 'before': expected a string of 1..256 characters, got ''"),
    (ChatSend, {}, "field 'text': missing (required)"),
    (ChatSend, {"text": ""}, "field 'text': expected a non-empty string, got ''"),
    (ChatSend, {"text": "  \n"}, "field 'text': expected text that is not only whitespace, got '  \\n'"),
    (ChatSend, {"text": None}, "field 'text': expected a non-empty string, got None"),
    (ChatSend, {"text": ["a"]}, "field 'text': expected a non-empty string, got ['a']"),
    (SessionRename, {"title": "t" * 201}, "field 'title': expected a string of 1..200 characters, got 'ttt"),
    (SessionRename, {}, "field 'title': missing (required)"),
    (SessionNew, {"title": " "}, "field 'title': expected text that is not only whitespace, got ' '"),
    (SessionNew, {"title": "a\nb"}, "field 'title': expected one line without control characters, got 'a\\nb'"),
    (SessionRename, {"title": "x\x00"}, "field 'title': expected one line without control characters"),
    (SessionRename, {"title": "a\u2028b"}, "field 'title': expected one line without control characters"),
    (SessionNew, {"title": "a\u2029b"}, "field 'title': expected one line without control characters"),
    (SessionNew, {"title": "a\u202eb"}, "field 'title': expected one line without control characters"),
    (SessionRename, {"title": "\u200b \u200b"}, "field 'title': expected text with a visible character"),
    (SessionSwitch, {}, "field 'session_id': missing (required)"),
    (SessionDelete, {"session_id": None}, "field 'session_id': expected a string of 1..128"),
    (HistorySearch, {}, "field 'query': missing (required)"),
    (HistorySearch, {"query": "q", "limit": 0}, "field 'limit': expected an integer >= 1, got 0"),
    (HistoryExport, {}, "field 'format': missing (required)"),
    (HistoryExport, {"format": "pdf"}, "field 'format': expected 'markdown' or 'json', got 'pdf'"),
    (ModelSwitch, {"model": 3}, "field 'model': expected a string of 1..200 characters, got 3"),
    (ChatCancel, {"turn_id": ""}, "field 'turn_id': expected a string of 1..128 characters, got ''"),
    (SessionList, {"deleted": "yes"}, "field 'deleted': expected true or false, got 'yes'"),
    (SessionClear, {"purge": 1}, "field 'purge': expected true or false, got 1"),
    (HistoryPage, {"superseded": 0}, "field 'superseded': expected true or false, got 0"),
    (SessionPrompt, {"system_prompt": 5}, "field 'system_prompt': expected a string of at most 20000 characters"),
    (SessionNew, {"system_prompt": "p" * 20001}, "field 'system_prompt': expected a string of at most 20000"),
    (SessionRestore, {}, "field 'session_id': missing (required)"),
    (SessionPurge, {"session_id": ""}, "field 'session_id': expected a string of 1..128 characters, got ''"),
    (ChatEdit, {"text": "x"}, "field 'message_id': missing (required)"),
    (ChatEdit, {"message_id": 0, "text": "x"}, "field 'message_id': expected an integer >= 1, got 0"),
    (ChatEdit, {"message_id": 2}, "field 'text': missing (required)"),
    (Hello, {"client": "c"}, "field 'proto': missing (required)"),
    (Hello, {"proto": "3", "client": "c"}, "field 'proto': expected an integer, got '3'"),
    (Hello, {"proto": True, "client": "c"}, "field 'proto': expected an integer, got True"),
    (Hello, {"proto": 3}, "field 'client': missing (required)"),
    (MemoryForget, {}, "field 'item_id': missing (required)"),
    (MemoryForget, {"item_id": 7}, "field 'item_id': expected a string of 1..128 characters, got 7"),
])
def test_field_errors_name_the_field(cls: type, body: dict, message: str) -> None:
    assert error_of(cls, {"id": 1, **body}).startswith(message)


def test_long_values_are_shortened_in_messages() -> None:
    message = error_of(SessionRename, {"id": 1, "title": "t" * 5000})
    assert message.endswith("...") and len(message) < 120


def test_titles_keep_visible_unicode() -> None:
    assert SessionRename.from_body({"id": 1, "title": "磁盘 \u200d👩‍💻 report"}).title == "磁盘 \u200d👩‍💻 report"
    assert HistoryPage.from_body({"id": 1, "limit": 10**6}).limit == 10**6  # bounded by the server


def test_hello_token_is_passed_on_as_sent() -> None:
    """The server judges the token (AUTH_FAILED, fatal), not the parser (a recoverable error)."""
    assert Hello.from_body({"id": 1, "proto": 3, "client": "c", "token": 5}).token == 5
    assert Hello.from_body({"id": 1, "proto": 3, "client": "c", "token": ""}).token == ""


def test_hello_proto_is_only_type_checked() -> None:
    assert Hello.from_body({"id": 0, "proto": 2, "client": "old"}).proto == 2


def test_parse_request_returns_typed_bodies() -> None:
    assert parse_request(Message(MsgType.PING, {"id": 4}, 0)) == Ping(4)
    assert parse_request(Message(MsgType.CHAT_TEXT, {"id": 5, "text": "x"}, 0)) == ChatSend(5, "x")


def test_parse_request_reports_invalid_bodies_with_the_request_id() -> None:
    bad = parse_request(Message(MsgType.HISTORY_REQUEST, {"id": "q7", "limit": "x"}, 3))
    assert isinstance(bad, InvalidMessage) and bad.re == "q7" and bad.seq == 3
    assert bad.type is MsgType.HISTORY_REQUEST and bad.code is ErrorCode.INVALID_MESSAGE
    assert bad.error.message == "field 'limit': expected an integer >= 1, got 'x'"
    no_id = parse_request(Message(MsgType.PING, {"id": -3}, 0))
    assert isinstance(no_id, InvalidMessage) and no_id.re is None


def test_parse_request_rejects_non_request_types() -> None:
    bad = parse_request(Message(MsgType.FILE_DATA, {"id": 8}, 1))
    assert isinstance(bad, InvalidMessage) and bad.code is ErrorCode.UNSUPPORTED and bad.re == 8
    assert bad.error.message == "FILE_DATA is not a request"
    raw = parse_request(Message(0x99, b"x", 1))
    assert isinstance(raw, InvalidMessage) and raw.re is None and "0x99" in raw.error.message


def test_request_id() -> None:
    assert request_id({"id": 0}) == 0 and request_id({"id": "a"}) == "a"
    for body in ({"id": True}, {"id": -1}, {}, [], b"x", None, {"id": "x" * 65}):
        assert request_id(body) is None

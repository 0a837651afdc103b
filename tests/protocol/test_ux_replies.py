"""The replies added for issue 16: SESSION_PROMPT and CHAT_REGENERATE / CHAT_EDIT round-trip and
validate; SESSION_RESTORE and SESSION_PURGE reuse the session and delete replies."""
from __future__ import annotations

import pytest

from protocol import ErrorCode, MsgType, ProtocolError
from protocol.objects import ChatMessage, SessionInfo
from protocol.replies import ChatRedoReply, SessionDeleteReply, SessionPromptReply, SessionReply, decode_reply

SESSION = SessionInfo("s_20261125_000000000001", "t", "2026-11-25T00:00:00+00:00", "2026-11-25T00:00:00+00:00")
USER = ChatMessage(3, "user", "two", "2026-11-25T00:00:00+00:00", (), {"edited_from": 1})


@pytest.mark.parametrize("reply", [
    SessionPromptReply(SESSION, "Be brief.", re=1),
    SessionPromptReply(SESSION, None, re="a"),
    ChatRedoReply("t_1", SESSION.session_id, USER, (4, 5), re=2),
    ChatRedoReply("t_1", SESSION.session_id, USER, re=2),
])
def test_round_trip(reply) -> None:
    body = reply.encode()
    assert type(reply).decode(body) == reply
    request = MsgType.SESSION_PROMPT if isinstance(reply, SessionPromptReply) else MsgType.CHAT_EDIT
    assert decode_reply(request, MsgType.RESPONSE, body) == reply


def test_encoded_shape() -> None:
    assert ChatRedoReply("t_1", "s", USER, (4,), re=2).encode() == {
        "re": 2, "turn_id": "t_1", "session_id": "s", "user_message": USER.encode(), "superseded": [4]}
    assert SessionPromptReply(SESSION, None).encode()["system_prompt"] is None


@pytest.mark.parametrize("superseded, message", [
    ("4", "field 'superseded': expected an array"),
    ([4, 0], "field 'superseded[1]': expected an integer >= 1, got 0"),
    ([True], "field 'superseded[0]': expected an integer >= 1, got True"),
])
def test_bad_superseded_ids(superseded, message) -> None:
    body = ChatRedoReply("t_1", "s", USER).encode()
    with pytest.raises(ProtocolError) as err:
        ChatRedoReply.decode({**body, "superseded": superseded})
    assert err.value.code is ErrorCode.INVALID_MESSAGE and str(err.value.message).startswith(message)


def test_restore_and_purge_reuse_replies() -> None:
    body = SessionReply(SESSION, re=1).encode()
    assert decode_reply(MsgType.SESSION_RESTORE, MsgType.RESPONSE, body) == SessionReply(SESSION, re=1)
    body = SessionDeleteReply("s", SESSION, re=1).encode()
    assert decode_reply(MsgType.SESSION_PURGE, MsgType.RESPONSE, body) == SessionDeleteReply("s", SESSION, re=1)
    assert decode_reply(MsgType.CHAT_REGENERATE, MsgType.RESPONSE,
                        ChatRedoReply("t", "s", USER).encode()) == ChatRedoReply("t", "s", USER)

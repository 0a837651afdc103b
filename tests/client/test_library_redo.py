"""The client library's issue-16 requests against a real in-process server on loopback: the session's
system prompt, regenerate, edit and resend, clear with purge."""
from __future__ import annotations

from client.connection import Client
from client.errors import ClientError
from protocol import ErrorCode
from protocol.server_events import TurnEnd, TurnError, TurnEvent
from client_testlib import next_event_of


async def finished(client: Client, turn_id: str) -> TurnEvent:
    while True:
        ev = await next_event_of(client, TurnEvent, pred=lambda e: e.turn_id == turn_id)
        if isinstance(ev, (TurnEnd, TurnError)):
            return ev


async def test_session_prompt_read_set_reset(client: Client) -> None:
    assert (await client.session_prompt()).system_prompt is None
    saved = await client.session_prompt("Answer in French.")
    assert saved.system_prompt == "Answer in French." and saved.session.session_id == client.session_id
    assert (await client.session_prompt()).system_prompt == "Answer in French."
    assert (await client.session_prompt("")).system_prompt is None


async def test_regenerate_and_edit_supersede(client: Client) -> None:
    sent = await client.chat_send("first")
    end = await finished(client, sent.turn_id)
    assert isinstance(end, TurnEnd) and end.message is not None
    old_answer = end.message.id
    redo = await client.chat_regenerate()
    assert redo.user_message.id == sent.user_message.id and old_answer in redo.superseded
    await finished(client, redo.turn_id)
    page = await client.history_page()
    assert old_answer not in {m.id for m in page.messages}
    assert [m.role for m in page.messages] == ["user", "assistant"]
    edit = await client.chat_edit(sent.user_message.id or 0, "first, edited")
    assert sent.user_message.id in edit.superseded
    assert edit.user_message.metadata.get("edited_from") == sent.user_message.id
    await finished(client, edit.turn_id)
    page = await client.history_page()
    assert [(m.role, m.content) for m in page.messages][0] == ("user", "first, edited")
    try:
        await client.chat_edit(sent.user_message.id or 0, "again")
    except ClientError as exc:
        assert exc.code == ErrorCode.NOT_FOUND
    else:
        raise AssertionError("editing a superseded message must fail")


async def test_clear_with_purge(client: Client) -> None:
    sent = await client.chat_send("to purge")
    await finished(client, sent.turn_id)
    reply = await client.session_clear(purge=True)
    assert reply.cleared == 2
    assert (await client.history_page()).messages == ()

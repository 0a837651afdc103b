"""Turns cut short by a crash: found from the stored messages, closed with an `interrupted` message."""
from __future__ import annotations

from server.agent.interrupted import interrupted_message, trailing_unanswered, unanswered
from storage.models import ChatMessage


def msgs(*roles: str) -> list[ChatMessage]:
    return [ChatMessage(id=i, role=r, content=f"{r} {i}") for i, r in enumerate(roles, 1)]


def test_answered_sessions_have_nothing_to_close():
    history = msgs("user", "assistant", "user", "assistant")
    assert unanswered(history) == [] and trailing_unanswered(history) is None
    assert trailing_unanswered([]) is None and unanswered([]) == []


def test_the_last_question_without_an_answer_is_the_one_to_close():
    history = msgs("user", "assistant", "user")
    assert [m.id for m in unanswered(history)] == [3] and trailing_unanswered(history).id == 3


def test_older_unanswered_questions_are_listed_but_only_the_tail_is_closed():
    history = msgs("user", "user", "assistant", "system", "user", "user")
    assert [m.id for m in unanswered(history)] == [1, 5, 6]
    assert trailing_unanswered(history).id == 6


def test_dicts_work_as_well_as_messages():
    history = [m.to_dict() for m in msgs("user", "assistant", "user")]
    assert [m["id"] for m in unanswered(history)] == [3] and trailing_unanswered(history)["id"] == 3


def test_the_closing_message_is_partial_with_its_own_finish_reason():
    closing = interrupted_message(ChatMessage(id=7, role="user", content="q"), model="m",
                                  detected_at="2026-11-25T11:00:00+00:00")
    assert closing.content == ""
    assert closing.metadata == {"partial": True, "interrupted": True, "finish_reason": "interrupted",
                                "answers": 7, "model": "m", "interrupted_detected_at": "2026-11-25T11:00:00+00:00"}

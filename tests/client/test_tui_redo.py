"""Issue 16 in the TUI, under Pilot against the fake client: honest delete (trash, restore, purge),
clear or clear-and-purge, the per-session system prompt, regenerate, edit-and-resend, and failed or
cancelled answers marked the same way live and after a reload."""
from __future__ import annotations

from typing import Any

from textual.widgets import Button, OptionList, TextArea

from client.tui.clear import ClearModal
from client.tui.editor import TextEditModal
from client.tui.modals import ConfirmModal
from client.tui.sidebar import Sidebar
from client.tui.trash import TrashScreen
from client_testlib import shown, chat, wait_until
from tui_script import answer, contents, scripted_app, user
from fake_client import FakeClient, stamp
from protocol.objects import SessionInfo, TurnState
from protocol.server_events import AnswerDelta, TurnEnd, TurnError, TurnStart


def two_sessions() -> FakeClient:
    return FakeClient([SessionInfo("s1", "First", stamp(0), stamp(5)), SessionInfo("s2", "Second", stamp(1), stamp(4))],
                      {"s1": [user(1, "hi"), answer(2, "hello")]})


async def test_delete_goes_to_the_trash_and_restore_brings_it_back() -> None:
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        sidebar = app.query_one(Sidebar)
        await wait_until(lambda: "s2" in sidebar.sessions, pilot=pilot, what="the sidebar")
        await pilot.press("f8")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the delete dialog")
        question = str(app.screen.query_one(".dialog-title").render())
        assert "trash" in question and "restore" in question and "purge" in question
        assert "cannot be undone" not in question
        await pilot.press("y")
        await wait_until(lambda: "s1" not in sidebar.sessions and app.controller.session_id == "s2",
                         pilot=pilot, what="the deleted session gone from the sidebar")
        assert "s1" in fake.trash
        await pilot.press("f10")
        await wait_until(lambda: isinstance(app.screen, TrashScreen) and app.screen.loaded, pilot=pilot,
                         what="the trash")
        trash = app.screen
        assert [s.session_id for s in trash.sessions] == ["s1"]
        assert trash.query_one("#trash-list", OptionList).option_count == 1
        await pilot.press("r")
        await wait_until(lambda: "s1" in sidebar.sessions and not trash.sessions, pilot=pilot,
                         what="the restored session back in the sidebar")
        assert ("session_restore", "s1") in fake.calls and "s1" in fake.sessions and not fake.trash
        assert app.controller.session_id == "s2"   # restoring does not switch
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, TrashScreen), pilot=pilot)


async def test_purge_asks_first_and_removes_for_good() -> None:
    fake = two_sessions()
    fake.trash["old"] = SessionInfo("old", "Old notes", stamp(2), stamp(3), 4, "the preview")
    async with scripted_app(fake) as (app, pilot):
        await app.run_action("trash")
        await wait_until(lambda: isinstance(app.screen, TrashScreen) and app.screen.loaded, pilot=pilot,
                         what="the trash")
        trash = app.screen
        await pilot.press("p")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the purge question")
        question = str(app.screen.query_one(".dialog-title").render())
        assert "for good" in question and "cannot be undone" in question and "Old notes" in question
        await pilot.press("n")   # cancelled: nothing is purged
        await wait_until(lambda: app.screen is trash, pilot=pilot)
        assert "old" in fake.trash and not any(c[0] == "session_purge" for c in fake.calls)
        await pilot.press("p")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot)
        await pilot.click("#confirm-yes")
        await wait_until(lambda: app.screen is trash and not trash.sessions, pilot=pilot, what="the purged session")
        assert ("session_purge", "old") in fake.calls and "old" not in fake.trash
        assert "old" not in app.query_one(Sidebar).sessions
        assert "empty" in str(trash.query_one("#trash-info").render())


async def test_clear_or_clear_and_purge() -> None:
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 2, pilot=pilot)
        await pilot.press("f9")
        await wait_until(lambda: shown(app, ClearModal), pilot=pilot, what="the clear dialog")
        text = str(app.screen.query_one(".dialog-title").render())
        assert "stays stored" in text and "purge" in text
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, ClearModal), pilot=pilot)
        assert len(contents(app)) == 2 and not any(c[0] == "session_clear" for c in fake.calls)
        await pilot.press("f9")
        await wait_until(lambda: shown(app, ClearModal), pilot=pilot)
        await pilot.click("#clear-purge")
        await wait_until(lambda: contents(app) == [], pilot=pilot, what="the cleared chat")
        assert ("session_clear", True) in fake.calls
        fake.messages["s1"].append(user(3, "again"))
        await pilot.press("f9")
        await wait_until(lambda: shown(app, ClearModal), pilot=pilot)
        await pilot.press("c")
        await wait_until(lambda: ("session_clear", False) in fake.calls, pilot=pilot, what="a plain clear")


async def test_system_prompt_is_read_edited_and_reset() -> None:
    fake = two_sessions()
    fake.prompts["s1"] = "You are terse."
    async with scripted_app(fake) as (app, pilot):
        await pilot.press("ctrl+o")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the prompt editor")
        area = app.screen.query_one("#editor-text", TextArea)
        assert area.text == "You are terse."
        area.load_text("Answer in French.")
        await pilot.press("ctrl+s")
        await wait_until(lambda: fake.prompts.get("s1") == "Answer in French.", pilot=pilot, what="the saved prompt")
        assert not isinstance(app.screen, TextEditModal)
        await app.run_action("system_prompt")   # the palette's way in: the same action
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot)
        area = app.screen.query_one("#editor-text", TextArea)
        assert area.text == "Answer in French."
        area.load_text("   ")
        app.screen.query_one("#editor-ok", Button).press()   # empty: back to the server's default
        await wait_until(lambda: "s1" not in fake.prompts, pilot=pilot, what="the reset prompt")
        assert ("session_prompt", "") in fake.calls


async def test_regenerate_reloads_without_the_superseded_answer() -> None:
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: contents(app) == [("user", "hi"), ("assistant", "hello")], pilot=pilot)
        await pilot.press("ctrl+r")
        await wait_until(lambda: contents(app) == [("user", "hi")], pilot=pilot, what="the old answer gone")
        assert ("chat_regenerate", "s1") in fake.calls and fake.superseded == {2}
        await fake.push(TurnStart("s1", "t1", user(1, "hi"), "fake"), AnswerDelta("s1", "t1", "hey", 0),
                        TurnEnd("s1", "t1", answer(3, "hey there")))
        await wait_until(lambda: contents(app) == [("user", "hi"), ("assistant", "hey there")], pilot=pilot,
                         what="the new answer")


async def test_regenerate_reattaches_a_turn_already_running() -> None:
    """The turn may start before the reload: the switch reply carries it, and its events are not doubled."""
    fake = two_sessions()
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 2, pilot=pilot)
        fake.running = TurnState("t1", "s1", user(1, "hi"), "generating", "hey", started_at=stamp(3))
        original = fake.session_switch

        async def switch(session_id: str) -> Any:
            reply = await original(session_id)
            return type(reply)(reply.session, fake.running)
        fake.session_switch = switch  # type: ignore[method-assign]
        await app.run_action("regenerate")
        await wait_until(lambda: contents(app) == [("user", "hi"), ("assistant", "hey")] and bool(chat(app).live),
                         pilot=pilot, what="the reattached new answer")
        await fake.push(AnswerDelta("s1", "t1", "hey", 0), AnswerDelta("s1", "t1", " you", 3),
                        TurnEnd("s1", "t1", answer(3, "hey you")))
        await wait_until(lambda: contents(app) == [("user", "hi"), ("assistant", "hey you")], pilot=pilot,
                         what="the finished answer, no delta repeated")


async def test_edit_the_last_sent_message_and_resend() -> None:
    fake = FakeClient(messages={"s1": [user(1, "first"), answer(2, "one"), user(3, "secnod"), answer(4, "two")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 4, pilot=pilot)
        await pilot.press("f5")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot, what="the edit dialog")
        area = app.screen.query_one("#editor-text", TextArea)
        assert area.text == "secnod"   # the last message the user sent
        area.load_text("second")
        await pilot.press("ctrl+s")
        await wait_until(lambda: contents(app) == [("user", "first"), ("assistant", "one"), ("user", "second")],
                         pilot=pilot, what="the chat reloaded with the edited message")
        assert ("chat_edit", (3, "second")) in fake.calls and fake.superseded == {3, 4}
        edited = chat(app).messages()[-1]
        assert edited.message.metadata.get("edited_from") == 3


async def test_edit_the_focused_user_message_and_cancel() -> None:
    fake = FakeClient(messages={"s1": [user(1, "first"), answer(2, "one"), user(3, "later"), answer(4, "two")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 4, pilot=pilot)
        chat(app).by_id[1].focus()
        await pilot.press("f5")
        await wait_until(lambda: shown(app, TextEditModal), pilot=pilot)
        assert app.screen.query_one("#editor-text", TextArea).text == "first"
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, TextEditModal), pilot=pilot)
        assert not any(c[0] == "chat_edit" for c in fake.calls) and len(contents(app)) == 4


async def test_a_failed_turn_shows_the_same_live_and_after_a_reload() -> None:
    fake = two_sessions()
    failed = answer(4, "half an", error="LLM_UNAVAILABLE", error_message="provider answered 500", attempts=3,
                    partial=True, finish_reason="error")
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(3, "more"), "fake"), AnswerDelta("s1", "t1", "half an", 0),
                        TurnError("s1", "t1", "LLM_UNAVAILABLE", "provider answered 500", failed))
        await wait_until(lambda: bool(app.query(".message .error")), pilot=pilot, what="the live error")
        live = [str(e.render()) for e in app.query(".message .error")]
        assert live == ["Error LLM_UNAVAILABLE: provider answered 500 (after 3 attempts)"]
        fake.messages["s1"] += [user(3, "more"), failed]
        app.controller.spawn(app.controller.switch("s2"), "session")
        await wait_until(lambda: chat(app).session_id == "s2" and app.controller._loads == 0, pilot=pilot)
        app.controller.spawn(app.controller.switch("s1"), "session")
        await wait_until(lambda: chat(app).session_id == "s1" and len(contents(app)) == 4, pilot=pilot,
                         what="the reloaded session")
        assert [str(e.render()) for e in app.query(".message .error")] == live
        view = chat(app).by_id[4]
        assert view.has_class("-error") and "partial" in view.header_text
        assert contents(app)[-1] == ("assistant", "half an")


async def test_cancelled_and_interrupted_empty_answers_are_marked() -> None:
    fake = FakeClient(messages={"s1": [user(1, "a"), answer(2, "", partial=True, finish_reason="cancelled"),
                                       user(3, "b"), answer(4, "", partial=True, finish_reason="interrupted")]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: len(contents(app)) == 4, pilot=pilot)
        views = chat(app).by_id
        assert "cancelled" in views[2].header_text and "interrupted" in views[4].header_text
        notes = [str(n.render()) for n in app.query(".message-note")]
        assert notes == ["Cancelled before any text was streamed.",
                         "Interrupted (the server stopped): no text of this answer was saved."]
        # live: a turn cancelled before any delta gets the same note
        await fake.push(TurnStart("s1", "t9", user(5, "c"), "fake"),
                        TurnEnd("s1", "t9", answer(6, "", partial=True), finish_reason="cancelled"))
        await wait_until(lambda: len(app.query(".message-note")) == 3, pilot=pilot, what="the live cancelled note")

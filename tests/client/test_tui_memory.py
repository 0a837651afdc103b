"""The long-term memory panel and the "why this answer" view, with Pilot against the fake client."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from textual.command import CommandPalette

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.memory_panel import MemoryPanel
from client.tui.modals import ConfirmModal
from client.tui.why import WhyScreen, why_lines
from client.wording import minute
from client_testlib import shown, SIZE, chat, wait_until
from fake_client import FakeClient, stamp
from protocol.objects import ChatMessage, MemoryItem, SessionInfo
from textual.widgets import OptionList, Static

ITEMS = [MemoryItem("m1", "fact", "The prod DB host is db-prod-42.", "s_20261120_a", 3, "2026-11-20T10:15:00+00:00"),
         MemoryItem("m2", "preference", "Please answer in Chinese.", "s_20261120_a", 5, "2026-11-20T10:16:00+00:00")]
CONTEXT = {"turns_kept": 2, "summary_used": 40, "recalled": [7, 9], "memory_items": ["m1", "m9"],
           "prompt_tokens_estimate": 812, "budget_tokens": 14976,
           "pipeline": {"route": {"decision": "chat", "reason": "no router configured"},
                        "recall": {"dropped": [
                            {"what": "turns", "count": 3, "why": "over the prompt budget"},
                            {"what": "recalled turns", "count": 2, "ids": [3, 5],
                             "why": "over recall.token_budget (50 tokens)"},
                            {"what": "recalled turns", "why": "recall.k (3) reached: lower-ranked turns were not considered"},
                            {"what": "memory items", "count": 1, "ids": ["m4"],
                             "why": "over user_memory.token_budget (40 tokens)"}]},
                        "retrieve": {"passages": [], "skipped": "not up front (the agent searches with search_knowledge)"},
                        "generate": {"model": "fake", "finish_reason": "stop", "tool_calls": ["clock"]}}}


def messages() -> dict[str, list[ChatMessage]]:
    return {"s1": [ChatMessage(1, "user", "where is the db?", stamp(1)),
                   ChatMessage(2, "assistant", "db-prod-42", stamp(2), metadata={"context": CONTEXT})]}


@asynccontextmanager
async def app_with(fake: FakeClient) -> AsyncIterator[tuple[NpltApp, Any]]:
    app = NpltApp(ClientConfig(), client=fake, show_times=False, show_address=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: fake.connected and chat(app).session_id is not None and app.controller._loads == 0
                         and bool(app.controller.models), pilot=pilot, what="the first session")
        yield app, pilot


async def test_memory_panel_from_the_palette_lists_and_forgets() -> None:
    fake = FakeClient()
    fake.memory = list(ITEMS)
    async with app_with(fake) as (app, pilot):
        await pilot.press("ctrl+p")
        await wait_until(lambda: shown(app, CommandPalette), pilot=pilot, what="the palette")
        await pilot.press(*"long-term memory")
        await pilot.press("enter")
        await wait_until(lambda: shown(app, MemoryPanel), pilot=pilot, what="the memory panel")
        panel = app.screen
        options = panel.query_one("#memory-items", OptionList)
        await wait_until(lambda: options.option_count == 2, pilot=pilot, what="two items")
        assert "2 items" in str(panel.query_one("#memory-info", Static).render())
        await pilot.press("delete")                       # the highlighted (first) item, after asking
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the confirmation")
        assert "The prod DB host is db-prod-42." in str(app.screen.query_one(Static).render())
        await pilot.press("n")                            # No keeps it
        await wait_until(lambda: app.screen is panel, pilot=pilot, what="back in the panel")
        assert not any(c[0] == "memory_forget" for c in fake.calls) and options.option_count == 2
        await pilot.press("delete")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the confirmation again")
        await pilot.press("y")
        await wait_until(lambda: options.option_count == 1, pilot=pilot, what="one item left")
        assert ("memory_forget", "m1") in fake.calls and [i.id for i in fake.memory] == ["m2"]
        assert options.get_option_at_index(0).id == "m2"
        await pilot.click("#memory-forget")
        await wait_until(lambda: shown(app, ConfirmModal), pilot=pilot, what="the button's confirmation")
        await pilot.click("#confirm-yes")
        await wait_until(lambda: options.option_count == 0, pilot=pilot, what="nothing left")
        assert "Nothing remembered yet" in str(panel.query_one("#memory-info", Static).render())
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, MemoryPanel), pilot=pilot, what="the panel closed")


async def test_memory_items_name_the_session_they_were_said_in() -> None:
    fake = FakeClient(sessions=[SessionInfo("s_20261120_a", "Prod database notes", stamp(0), stamp(0))])
    fake.memory = [*ITEMS, MemoryItem("m3", "fact", "Our region is eu-3.", "s_gone", 2, "2026-11-20T10:17:00+00:00")]
    async with app_with(fake) as (app, pilot):
        app.action_memory()
        await wait_until(lambda: shown(app, MemoryPanel), pilot=pilot, what="the memory panel")
        options = app.screen.query_one("#memory-items", OptionList)
        await wait_until(lambda: options.option_count == 3, pilot=pilot, what="three items")
        prompts = [str(options.get_option_at_index(n).prompt) for n in range(3)]
        at = minute("2026-11-20T10:15:00+00:00")                                     # local time
        assert f"m1 · in “Prod database notes” · {at}" in prompts[0]                  # a session the sidebar lists
        assert f"m3 · session s_gone · {minute('2026-11-20T10:17:00+00:00')}" in prompts[2]   # one it does not: its id


async def test_why_this_answer_shows_what_reached_the_model() -> None:
    fake = FakeClient(messages=messages())
    fake.memory = list(ITEMS)
    async with app_with(fake) as (app, pilot):
        await wait_until(lambda: len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        await pilot.press("f6")
        await wait_until(lambda: shown(app, WhyScreen), pilot=pilot, what="the why view")
        body = str(app.screen.query_one("#why-body", Static).render())
        assert "Summary: messages up to #40" in body and "Recalled earlier turns: #7, #9" in body
        assert "m1: The prod DB host is db-prod-42." in body and "m9: (forgotten since)" in body
        assert "2 recalled turns (#3, #5): over recall.token_budget (50 tokens)" in body
        assert "  recalled turns: recall.k (3) reached: lower-ranked turns were not considered" in body
        assert "1 memory items (m4): over user_memory.token_budget (40 tokens)" in body
        assert "3 turns: over the prompt budget" in body
        assert "\nKnowledge passages: not up front (the agent searches with search_knowledge)\n" in body
        assert "Prompt: about 812 of 14976 tokens" in body and "tools: clock" in body
        await pilot.press("escape")


def test_why_lines_without_context() -> None:
    assert why_lines({}) == ["No context was recorded for this message."]


def test_why_lines_say_why_no_knowledge_passage_was_used() -> None:
    def passages(retrieve: dict) -> str:
        lines = why_lines({"context": {"turns_kept": 1, "pipeline": {"retrieve": retrieve}}})
        return next(line for line in lines if line.startswith("Knowledge passages:"))
    assert passages({"passages": [], "skipped": "not up front (the agent searches with search_knowledge)"}) == (
        "Knowledge passages: not up front (the agent searches with search_knowledge)")
    assert passages({"passages": [], "skipped": "route"}) == "Knowledge passages: none (the route asked for no knowledge)"
    assert passages({"passages": ["c1", "c2"]}) == "Knowledge passages: c1, c2"
    assert passages({}) == "Knowledge passages: none"


async def test_why_this_answer_on_a_live_answer_from_a_real_server(tmp_path) -> None:
    from client_testlib import open_app, type_and_send, v3_server
    async with v3_server(tmp_path, memory="auto") as (_, addr):
        async with open_app(addr) as (app, pilot):
            await type_and_send(pilot, "hello there")
            await wait_until(lambda: any(m.role == "assistant" and m.message_id and m.turn_id is None
                                         for m in chat(app).messages()), pilot=pilot, what="the answer")
            await pilot.press("f6")
            await wait_until(lambda: shown(app, WhyScreen), pilot=pilot, what="the why view")
            body = str(app.screen.query_one("#why-body", Static).render())
            assert "Route: chat (no router configured)" in body and "Summary: none" in body
            assert "Knowledge passages: not up front (the agent searches with search_knowledge)\n" in body
            assert "Model: echo" in body

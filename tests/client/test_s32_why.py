"""The "why this answer" view (s32): tool results cut to fit the budget (this turn's and the earlier
turns'), the largest request's size, and the notes for a request larger than the model window and
for failed summaries. It said "Left out: nothing" when tool results had been cut.

The last tests take the metadata from a real server answering through the scripted endpoint, and
open the view with Pilot against the fake client."""
from __future__ import annotations

import json
from typing import Any

from textual.widgets import Static

from client.tui.app import NpltApp
from client.config import ClientConfig
from client.tui.why import FALLBACK_NOTE, FLOORED_NOTE, WhyScreen, why_lines
from client_testlib import SIZE, chat, shown, wait_until
from fake_client import FakeClient, stamp
from protocol import MsgType as T
from protocol.objects import ChatMessage
from server.app import Server
from testkit.scripted_llm import Reply, StreamedOnlyLLM, ToolCallSpec
from testkit.server import V3Client, make_config

EXCHANGE = {"follow_up_requests": 2, "prompt_tokens_max": 5890, "budget_tokens": 5976,
            "cut": [{"what": "tool results", "count": 3, "ids": ["r0_a", "r0_b", "r1_a"],
                     "why": "over the prompt budget: this turn's results cut, oldest first"},
                    {"what": "tool steps", "count": 1,
                     "why": "over the prompt budget even with every result cut: left out of the last call"}],
            "ended": "the tool results no longer fit the prompt budget: answered without more tools"}
CONTEXT = {"turns_kept": 1, "turns_dropped": 0, "prompt_tokens_estimate": 4100, "budget_tokens": 5976,
           "tool_schema_tokens": 2900, "window_results_cut": {"count": 6, "turns": 1}, "tool_exchange": EXCHANGE,
           "summary_fallback": True, "budget_floored": True,
           "pipeline": {"route": {"decision": "chat", "reason": "no router configured"},
                        "recall": {"dropped": [], "budget_floored": True},
                        "generate": {"model": "m", "finish_reason": "stop", "tool_calls": ["read_file"]}}}


def test_cut_tool_results_the_largest_request_and_the_notes_are_shown():
    lines = why_lines({"context": CONTEXT})
    assert "Left out: nothing" not in lines
    i = lines.index("Earlier tool results cut: 6 in 1 earlier turn (to fit the budget or their share of it)")
    assert lines[i + 1:i + 3] == ["Tool results cut: 3 (to fit the budget)",
                                  "Tool steps left out of the last call: 1 (to fit the budget)"]
    assert "Note: the tool results no longer fit the prompt budget: answered without more tools" in lines
    assert FALLBACK_NOTE == "Note: summaries failed: old turns were dropped instead" and FALLBACK_NOTE in lines
    assert FLOORED_NOTE == ("Note: the request exceeded the model window; raise context.max_input_tokens")
    assert lines.count(FLOORED_NOTE) == 1
    p = lines.index("Prompt: about 4100 of 5976 tokens")
    assert lines[p + 1] == "Largest request: about 5890 of 5976 tokens (2 follow-up requests with tool results)"


def test_cuts_follow_what_was_left_out_and_nothing_cut_still_says_nothing():
    ctx = {**CONTEXT, "pipeline": {"recall": {"dropped": [{"what": "turns", "count": 2, "why": "over the prompt budget"}]}}}
    lines = why_lines({"context": ctx})
    i = lines.index("Left out:")
    assert lines[i + 1] == "  2 turns: over the prompt budget"
    assert lines[i + 2] == "Earlier tool results cut: 6 in 1 earlier turn (to fit the budget or their share of it)"
    plain = why_lines({"context": {"turns_kept": 2, "prompt_tokens_estimate": 10, "budget_tokens": 100,
                                   "summary_fallback": False,
                                   "tool_exchange": {"follow_up_requests": 0, "prompt_tokens_max": 0, "cut": []}}})
    assert "Left out: nothing" in plain and not any(x.startswith(("Note:", "Largest", "Tool", "Earlier")) for x in plain)
    floored_in_trace = why_lines({"context": {"pipeline": {"recall": {"budget_floored": True}}}})
    assert FLOORED_NOTE in floored_in_trace


def test_odd_metadata_does_not_break_the_view():
    for exchange in ("cut", None, [], {"cut": "x"}, {"cut": [None, {"what": "tool results", "count": "3"}]},
                     {"prompt_tokens_max": True, "follow_up_requests": 1}):
        lines = why_lines({"context": {"turns_kept": 1, "tool_exchange": exchange, "window_results_cut": 7}})
        assert "Left out: nothing" in lines and not any(x.startswith(("Tool", "Largest", "Earlier")) for x in lines)
    lines = why_lines({"context": {"window_results_cut": {"count": 2}}})
    assert "Earlier tool results cut: 2 (to fit the budget or their share of it)" in lines



async def _turn(c: V3Client, text: str) -> dict[str, Any]:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return events[-1].body


async def test_the_view_of_real_answers_names_the_cut_tool_results(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    big = files / "big.log"
    big.write_text("".join(f"{i:04d} worker{i} handled request{i} in {i % 97} ms status ok\n" for i in range(400)))
    args = json.dumps({"path": str(big)})
    async with StreamedOnlyLLM() as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "summarization": {"enabled": False},
            "context": {"max_input_tokens": 9000, "reserve_output_tokens": 1024},
            "tools": {"file_roots": [str(files)]}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.tools(*[ToolCallSpec(f"r{i}", "read_file", args) for i in range(3)]), Reply.text("read"))
            first = await _turn(c, "read big.log three times")
            llm.push(Reply.text("ok"))
            second = await _turn(c, "and now?")
            await c.close()
        finally:
            await srv.stop()
    lines = why_lines(first["message"]["metadata"])
    cut = first["context"]["tool_exchange"]["cut"][0]["count"]
    assert cut >= 1 and f"Tool results cut: {cut} (to fit the budget)" in lines and "Left out: nothing" not in lines
    largest = first["context"]["tool_exchange"]["prompt_tokens_max"]
    budget = first["context"]["budget_tokens"]
    assert f"Largest request: about {largest} of {budget} tokens (1 follow-up request with tool results)" in lines
    window = second["context"]["window_results_cut"]
    lines = why_lines(second["message"]["metadata"])
    assert second["context"]["turns_dropped"] == 0 and "Left out: nothing" not in lines
    turns = "1 earlier turn"
    assert f"Earlier tool results cut: {window['count']} in {turns} (to fit the budget or their share of it)" in lines


async def test_a_floored_budget_is_named_in_the_view_of_a_real_answer(tmp_path):
    async with StreamedOnlyLLM() as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "summarization": {"enabled": False},
            "context": {"max_input_tokens": 512, "reserve_output_tokens": 256}})   # 256 left: the schemas need more
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.text("hi"))
            end = await _turn(c, "hello")
            await c.close()
        finally:
            await srv.stop()
    assert end["context"]["budget_floored"] is True
    assert FLOORED_NOTE in why_lines(end["message"]["metadata"])


async def test_the_why_view_shows_the_cuts_and_notes() -> None:
    fake = FakeClient(messages={"s1": [ChatMessage(1, "user", "read the logs", stamp(1)),
                                       ChatMessage(2, "assistant", "done", stamp(2), metadata={"context": CONTEXT})]})
    app = NpltApp(ClientConfig(), client=fake, show_times=False, show_address=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: fake.connected and chat(app).session_id is not None and app.controller._loads == 0
                         and len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        await pilot.press("f6")
        await wait_until(lambda: shown(app, WhyScreen), pilot=pilot, what="the why view")
        body = str(app.screen.query_one("#why-body", Static).render())
        assert "Tool results cut: 3 (to fit the budget)" in body and "Left out: nothing" not in body
        assert "Earlier tool results cut: 6 in 1 earlier turn (to fit the budget or their share of it)" in body
        assert FLOORED_NOTE in body and FALLBACK_NOTE in body
        assert "Largest request: about 5890 of 5976 tokens (2 follow-up requests with tool results)" in body

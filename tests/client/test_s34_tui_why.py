"""Review s34 of the "why this answer" view: messages of earlier turns cut in the middle to fit the
budget (``window_texts_cut``) are named, not "Left out: nothing" (the metadata from a real server
answering through the scripted endpoint); the knowledge passages name a group document's group,
as the Sources do, so a personal and a group document of one name are two different entries."""
from __future__ import annotations

from typing import Any

from textual.widgets import Static

from client.config import ClientConfig
from client.tui.app import NpltApp
from client.tui.why import WhyScreen, why_lines
from client_testlib import SIZE, chat, shown, wait_until
from fake_client import FakeClient, stamp
from protocol import MsgType as T
from protocol.objects import ChatMessage
from server.app import Server
from testkit.scripted_llm import Reply, StreamedOnlyLLM
from testkit.server import V3Client, make_config

LOG = "".join(f"2026-11-27 10:{i % 60:02d}:00 worker-{i} GET /api/v1/items/{i} 200 {i % 97}ms\n"
              for i in range(600))[:30000]


async def _turn(c: V3Client, text: str) -> dict[str, Any]:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return events[-1].body


async def _why_body(metadata: dict[str, Any]) -> str:
    """The why view of an answer with ``metadata``, opened with F6."""
    fake = FakeClient(messages={"s1": [ChatMessage(1, "user", "q", stamp(1)),
                                       ChatMessage(2, "assistant", "a", stamp(2), metadata=metadata)]})
    app = NpltApp(ClientConfig(), client=fake, show_times=False, show_address=False)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(lambda: fake.connected and chat(app).session_id is not None and app.controller._loads == 0
                         and len(chat(app).messages()) == 2, pilot=pilot, what="the history")
        await pilot.press("f6")
        await wait_until(lambda: shown(app, WhyScreen), pilot=pilot, what="the why view")
        return str(app.screen.query_one("#why-body", Static).render())


async def test_earlier_messages_cut_in_the_middle_are_named(tmp_path) -> None:
    async with StreamedOnlyLLM() as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": llm.model, "retries": 0},
            "summarization": {"enabled": False},
            "context": {"max_input_tokens": 20000, "reserve_output_tokens": 1024}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.text("I see 600 requests."), Reply.text("Same log again."), Reply.text("Nothing else."))
            await _turn(c, LOG)
            await _turn(c, LOG)
            end = await _turn(c, "any errors in that log?")
            await c.close()
        finally:
            await srv.stop()
    cut = end["context"]["window_texts_cut"]
    assert cut["count"] >= 1 and end["context"]["turns_dropped"] == 0
    turns = f"{cut['turns']} earlier turn{'s' if cut['turns'] != 1 else ''}"
    line = f"Earlier messages cut in the middle: {cut['count']} in {turns} (to fit the budget)"
    assert line in why_lines(end["message"]["metadata"])
    body = await _why_body(end["message"]["metadata"])
    assert line in body and "Left out: nothing" not in body


async def test_the_knowledge_passages_name_a_group_documents_group() -> None:
    cites = [{"citation": "[runbook.md §Restore]", "name": "runbook.md", "chunk_id": "c1", "collection": "user:alice"},
             {"citation": "[runbook.md §Restore]", "name": "runbook.md", "chunk_id": "c2", "collection": "group:ops"}]
    meta = {"citations": cites,
            "context": {"turns_kept": 1, "pipeline": {"retrieve": {"passages": ["[runbook.md §Restore]"] * 2}}}}
    line = "Knowledge passages: [runbook.md §Restore], [runbook.md §Restore] (group ops)"
    assert line in why_lines(meta)
    assert line in await _why_body(meta)
    # a passage the answer does not cite (no collection known) is shown as the trace names it
    odd = {"citations": [None, {"citation": 3}], "context": {"pipeline": {"retrieve": {"passages": ["[x.md]", 7]}}}}
    assert "Knowledge passages: [x.md], #7" in why_lines(odd)

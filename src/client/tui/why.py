"""The "why this answer" view: what reached the model for one answer, from the answer's stored
context metadata (the server's turn pipeline trace: route, summary, recalled turns, long-term memory
items, knowledge passages, what was dropped for the budget and why)."""
from __future__ import annotations

from typing import Any, Mapping

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from client.wording import printable


# why the retrieve step put no passage in the prompt (its ``skipped``), when the server's words need
# a gloss; any other reason is shown as the server wrote it, e.g. "not up front (the agent searches
# with search_knowledge)"
SKIPPED = {"route": "none (the route asked for no knowledge)"}


def _ids(values: Any) -> str:
    return ", ".join(f"#{v}" if isinstance(v, int) else str(v) for v in values) if values else "none"


def why_lines(metadata: Mapping[str, Any], memory_texts: Mapping[str, str] | None = None) -> list[str]:
    """Readable lines for an answer's metadata (``metadata["context"]``); memory item ids are shown
    with their text when the item still exists (``memory_texts``), else as forgotten."""
    ctx = metadata.get("context") or {}
    trace = ctx.get("pipeline") or {}
    texts = memory_texts or {}
    if not ctx:
        return ["No context was recorded for this message."]
    out: list[str] = []
    route = trace.get("route") or {}
    by = f", decided by the {route['decided_by']}" if route.get("decided_by") else ""
    out.append(f"Route: {route.get('decision', 'chat')}" + (f" ({route['reason']}{by})" if route.get("reason") else ""))
    recall = trace.get("recall") or {}
    if recall.get("system_prompt"):
        out.append("System prompt: " + ("this session's own" if recall["system_prompt"] == "session"
                                        else "the server's"))
    summary = ctx.get("summary_used")
    out.append(f"Summary: messages up to #{summary}" if summary else "Summary: none")
    out.append(f"Recent turns kept: {ctx.get('turns_kept', 0)}")
    out.append(f"Recalled earlier turns: {_ids(ctx.get('recalled'))}")
    items = ctx.get("memory_items") or []
    out.append(f"Long-term memory items: {len(items) if items else 'none'}")
    for item_id in items:
        out.append(f"  {item_id}: {texts.get(item_id, '(forgotten since)')}")
    retrieve = trace.get("retrieve") or {}
    passages, skipped = retrieve.get("passages") or [], retrieve.get("skipped")
    out.append("Knowledge passages: " + (SKIPPED.get(skipped, skipped) if skipped and not passages else _ids(passages)))
    dropped = list((trace.get("recall") or {}).get("dropped") or [])
    dropped += [{"what": f"passage {d.get('citation')}", "count": 1, "why": d.get("why")}
                for d in retrieve.get("dropped") or []]
    if dropped:
        out.append("Left out:")
        out += [_left_out(d) for d in dropped]
    else:
        out.append("Left out: nothing")
    for flag, text in (("summary_trimmed", "the summary was shortened to fit"),
                       ("message_truncated", "your message was shortened to fit"),
                       ("system_truncated", "the system prompt was shortened to fit")):
        if ctx.get(flag):
            out.append(f"Note: {text}")
    if ctx.get("prompt_tokens_estimate") is not None:
        out.append(f"Prompt: about {ctx['prompt_tokens_estimate']} of {ctx.get('budget_tokens')} tokens")
    gen = trace.get("generate") or {}
    if gen:
        calls = gen.get("tool_calls") or []
        out.append(f"Model: {gen.get('model')} · finish: {gen.get('finish_reason')} · tools: "
                   + (", ".join(calls) if calls else "none"))
    return out


def _left_out(d: Mapping[str, Any]) -> str:
    """``  3 memory items (m1, m2, m3): over user_memory.token_budget (300 tokens)``; without a count
    (a limit reached, what lies past it unknown): ``  recalled turns: recall.k (5) reached ...``."""
    head = f"{d['count']} {d.get('what')}" if d.get("count") is not None else str(d.get("what"))
    ids = f" ({_ids(d['ids'])})" if d.get("ids") else ""
    return f"  {head}{ids}: {d.get('why')}"


class WhyScreen(ModalScreen[None]):
    """Shows ``why_lines`` for one answer."""

    BINDINGS = [Binding("escape,q", "dismiss(None)", "Close", show=False)]

    def __init__(self, title: str, lines: list[str]) -> None:
        super().__init__(classes="modal")
        self.title_text, self.lines = title, lines

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(self.title_text, classes="dialog-title")
            with VerticalScroll():
                yield Static(printable("\n".join(self.lines)), markup=False, id="why-body")   # the server's words
            yield Static("Esc closes", classes="dim")

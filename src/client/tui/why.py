"""The "why this answer" view: what reached the model for one answer, from the answer's stored
context metadata (the server's turn pipeline trace: route, summary, recalled turns, long-term memory
items, knowledge passages, what was dropped or cut for the budget and why, the prompt's size and the
largest request's against the budget, and notes when summaries failed or the request exceeded the
model window)."""
from __future__ import annotations

from typing import Any, Mapping

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from client.tui.citations import UNVERIFIED_LABEL, source_label, unverified_of
from client.wording import printable


# why the retrieve step put no passage in the prompt (its ``skipped``), when the server's words need
# a gloss; any other reason is shown as the server wrote it, e.g. "not up front (the agent searches
# with search_knowledge)"
SKIPPED = {"route": "none (the route asked for no knowledge)"}
FLOORED_NOTE = "Note: the request exceeded the model window; raise context.max_input_tokens"
FALLBACK_NOTE = "Note: summaries failed: old turns were dropped instead"
# what the agent cut of the turn's own tool steps (``tool_exchange.cut[].what``) -> the line's head
EXCHANGE_CUTS = {"tool results": "Tool results cut", "tool steps": "Tool steps left out of the last call"}


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
    out.append("Knowledge passages: " + (SKIPPED.get(skipped, skipped) if skipped and not passages
                                         else _ids(_passage_labels(passages, metadata))))
    unverified = unverified_of(metadata)
    if unverified:                       # cited by the answer, matching no passage it was given
        out.append(f"Citations {UNVERIFIED_LABEL} " + " ".join(unverified))
    unreadable = _count(recall.get("unreadable_passages"))
    if unreadable:                       # replayed passages of documents deleted (or no longer readable)
        out.append(f"Earlier passages of documents deleted or no longer readable: {unreadable} (left out)")
    dropped = list((trace.get("recall") or {}).get("dropped") or [])
    dropped += [{"what": f"passage {d.get('citation')}", "count": 1, "why": d.get("why")}
                for d in retrieve.get("dropped") or []]
    exchange = ctx.get("tool_exchange") if isinstance(ctx.get("tool_exchange"), Mapping) else {}
    cuts = _cut_lines(ctx, exchange)
    if dropped:
        out.append("Left out:")
        out += [_left_out(d) for d in dropped]
    elif not cuts:
        out.append("Left out: nothing")
    out += cuts
    for flag, text in (("summary_trimmed", "the summary was shortened to fit"),
                       ("message_truncated", "your message was shortened to fit"),
                       ("system_truncated", "the system prompt was shortened to fit")):
        if ctx.get(flag):
            out.append(f"Note: {text}")
    if isinstance(exchange.get("ended"), str):
        out.append(f"Note: {exchange['ended']}")
    if ctx.get("summary_fallback"):
        out.append(FALLBACK_NOTE)
    if ctx.get("budget_floored") or (trace.get("recall") or {}).get("budget_floored"):
        out.append(FLOORED_NOTE)
    if ctx.get("prompt_tokens_estimate") is not None:
        out.append(f"Prompt: about {ctx['prompt_tokens_estimate']} of {ctx.get('budget_tokens')} tokens")
    largest, requests = _count(exchange.get("prompt_tokens_max")), _count(exchange.get("follow_up_requests"))
    if largest and requests:
        budget = exchange.get("budget_tokens", ctx.get("budget_tokens"))
        out.append(f"Largest request: about {largest} of {budget} tokens "
                   f"({requests} follow-up request{'s' if requests != 1 else ''} with tool results)")
    gen = trace.get("generate") or {}
    if gen:
        calls = gen.get("tool_calls") or []
        out.append(f"Model: {gen.get('model')} · finish: {gen.get('finish_reason')} · tools: "
                   + (", ".join(calls) if calls else "none"))
    return out


def _passage_labels(passages: list[Any], metadata: Mapping[str, Any]) -> list[Any]:
    """The trace's passages (their citations) as the Sources show them (``source_label``): a
    passage of a group's document followed by ``(group NAME)``, its collection taken from the
    answer's ``citations`` of that citation string (each used once, in order), so a personal and a
    group document of one name do not read as two identical entries."""
    cites: dict[str, list[Mapping[str, Any]]] = {}
    for c in metadata.get("citations") or ():
        if isinstance(c, Mapping) and isinstance(c.get("citation"), str):
            cites.setdefault(c["citation"], []).append(c)
    out: list[Any] = []
    for p in passages:
        same = cites.get(p) if isinstance(p, str) else None
        out.append(source_label({**same.pop(0), "chunk_id": p}) if same else p)
    return out


def _count(value: Any) -> int:
    """A count from the metadata; 0 for anything that is not a positive integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _cut_lines(ctx: Mapping[str, Any], exchange: Mapping[str, Any]) -> list[str]:
    """What was cut rather than left out to fit the budget: the earlier turns' tool results (the
    context builder's ``window_results_cut``) and oversize messages (``window_texts_cut``: cut in
    the middle), this turn's tool results and steps (the agent's
    ``tool_exchange.cut``)."""
    out: list[str] = []
    window = ctx.get("window_results_cut")
    if isinstance(window, Mapping) and _count(window.get("count")):
        turns = _count(window.get("turns"))
        where = f" in {turns} earlier turn{'s' if turns != 1 else ''}" if turns else ""
        out.append(f"Earlier tool results cut: {window['count']}{where} (to fit the budget or their share of it)")
    texts = ctx.get("window_texts_cut")
    if isinstance(texts, Mapping) and _count(texts.get("count")):
        turns = _count(texts.get("turns"))
        where = f" in {turns} earlier turn{'s' if turns != 1 else ''}" if turns else ""
        out.append(f"Earlier messages cut in the middle: {texts['count']}{where} (to fit the budget)")
    cuts = exchange.get("cut")
    for cut in cuts if isinstance(cuts, list) else ():
        if isinstance(cut, Mapping) and _count(cut.get("count")):
            head = EXCHANGE_CUTS.get(str(cut.get("what")), f"{cut.get('what')} cut".capitalize())
            out.append(f"{head}: {cut['count']} (to fit the budget)")
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

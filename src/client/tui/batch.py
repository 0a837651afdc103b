"""Event batching for the TUI: coalesce streamed ANSWER_DELTA events that are already waiting.

The server streams deltas far faster than one Markdown render each. When the controller takes an
ANSWER_DELTA, it also takes every event already queued in the client (``drain``), splits the batch
into runs of deltas of one turn (``runs``) and renders each run with a single append of the joined
text (``state.join_deltas``); other events in the batch are handled in order, one by one. Events that do
not touch the live message (session list changes, notices) do not split a run: they are handled
right after it.
"""
from __future__ import annotations

from typing import Any, Iterable

from protocol.server_events import AnswerDelta, Notice, SessionEvent

from client.events import Event, InvalidFrame, ServerError


async def drain(client: Any, batch: list[Event], limit: int) -> bool:
    """Append the events already waiting in ``client``'s queue to ``batch`` (at most ``limit`` in all).

    Queued events are taken without suspending; the check that finds the queue empty yields to the
    event loop once. Returns True when the client closed (its event stream ended).
    """
    while len(batch) < limit:
        try:
            event = await client.next_event(timeout=0)
        except TimeoutError:
            return False
        if event is None:
            return True
        batch.append(event)
    return False


# Events that never touch the chat's live messages: they do not break a run of deltas (they are
# handled right after it, in their order). Connection changes and every other turn event do break it.
NEUTRAL_EVENTS = (SessionEvent, Notice, ServerError, InvalidFrame)


def runs(batch: Iterable[Event]) -> list[list[Event]]:
    """Split a batch into runs handled in order: the ANSWER_DELTAs of one turn form one run, which
    only a delta of another turn or a non-neutral event ends; any other event is a run of its own."""
    out: list[list[Event]] = []
    current: list[AnswerDelta] | None = None
    for event in batch:
        if isinstance(event, AnswerDelta):
            if current is not None and (event.session_id, event.turn_id) == (current[0].session_id,
                                                                              current[0].turn_id):
                current.append(event)
                continue
            current = [event]
            out.append(current)  # type: ignore[arg-type]
        else:
            out.append([event])
            if not isinstance(event, NEUTRAL_EVENTS):
                current = None
    return out

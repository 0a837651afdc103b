"""Start-up: close the turns a crash cut short (issue 15, item 5).

The marker of turns in flight (``server.inflight``) names the sessions that had a turn running when
the previous server process died; only those are read (a store of a million sessions costs one
small file read). A session whose last stored message is a user message gets an assistant message
built by ``server.agent.interrupted.interrupted_message``: empty content, ``partial: true``,
``interrupted: true``, ``finish_reason: "interrupted"``. It runs before the server listens, so no
new turn can slip in between; the marker is then started afresh, so a second restart closes nothing
twice (and the stored answer would stop it anyway: the session no longer ends with a question).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from server.agent.interrupted import interrupted_message, trailing_unanswered, unanswered
from server.inflight import MARKER_NAME, InFlightTurns, NoMarker, read_marker
from storage.errors import InvalidSessionId, NotFound
from storage.models import now_iso

log = logging.getLogger("nplt.recovery")


def marker_for(store: Any) -> NoMarker:
    """The marker file in the store's directory, or no marker for a store without one (PostgreSQL)."""
    root = getattr(getattr(store, "sync", None), "root", None)
    return InFlightTurns(f"{root}/{MARKER_NAME}") if isinstance(root, str) else NoMarker()


async def close_interrupted_turns(store: Any, marker: NoMarker, model_of: Any) -> int:
    """Close every turn the marker says was running; returns how many were closed.

    ``model_of(record) -> str`` names the model recorded on the closing message.
    """
    if marker.path is None:
        return 0
    candidates = await asyncio.to_thread(read_marker, marker.path)
    closed = older = 0
    failed: list[str] = []
    for sid in candidates:
        try:
            rec = await store.get(sid)
            if rec.deleted:
                continue
            messages = await store.messages(sid)
            last = trailing_unanswered(messages)
            older += len(unanswered(messages)) - (last is not None)
            if last is None:
                continue
            model = model_of(rec)
            closing = interrupted_message(last, model=model, detected_at=now_iso())
            await store.append(sid, "assistant", closing.content, metadata=closing.metadata)
            closed += 1
            log.warning("session %s: the turn answering message %d was interrupted (closed as interrupted)",
                        sid, last.id)
        except (NotFound, InvalidSessionId):
            continue   # deleted or purged since: nothing to close
        except Exception as exc:   # one bad session must not stop the server from starting
            log.error("session %s: interrupted turn not closed (tried again at the next start): %s", sid, exc)
            failed.append(sid)
    await asyncio.to_thread(marker.reset, failed)
    if candidates:
        log.info("interrupted turns: %d session(s) checked, %d closed, %d older unanswered message(s) left",
                 len(candidates), closed, older)
    return closed

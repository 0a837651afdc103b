"""SessionView: one session's messages not covered by its summary, kept current turn by turn.

Rebuilding every prompt from storage would re-read, re-expand and re-count the whole unsummarized
history each turn. A view keeps, per session:

* for every uncovered message (visible, id above the summary's ``covers_to_id``): its id, role and
  prompt cost (tokens once expanded) -- all that the summary triggers and the cut need;
* the positions where turns start, so ``turns_older`` is a bisection, not a scan;
* the stored messages themselves, expanded and counted once, for the newest ``keep_turns`` turns
  only (the recent window, and the unfinished turn the recall index has not consumed yet).

``MemoryManager`` syncs a view with one read: the cached tail again plus the messages stored since
the last look. A tail message that changed in place (``HistoryStore.update``) is expanded again;
when the ids or roles do not match, the visible message count does not add up (a clear, a
restore) or the summary moved backwards, the view is rebuilt from storage. An in-place update of
an older uncovered message only matters to the trigger's token total and is picked up at the next
rebuild (``MemoryManager.forget_session`` forces one).
"""
from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from storage.models import ChatMessage, SessionRecord

from server.memory.context import Turn, expand_message, sanitize
from server.memory.tokens import TokenCounter, message_tokens


@dataclass(slots=True)
class Entry:
    """One cached message: as stored, expanded for the prompt, and its prompt tokens."""
    message: ChatMessage
    expanded: list[dict[str, Any]]
    cost: int


def expand(m: ChatMessage, counter: TokenCounter) -> Entry:
    """``m`` as prompt messages (exactly ``build_turns([m])``: ``expand_message``) with its token cost."""
    expanded = expand_message(m)
    return Entry(m, expanded, sum(message_tokens(counter, x) for x in expanded))


_STATE = ("record", "valid", "covers", "seen", "last_id", "ids", "roles", "costs", "starts", "tail", "tail_pos")


def built_view(keep_turns: int, record: SessionRecord, covers: int, messages: list[ChatMessage],
               counter: TokenCounter) -> SessionView:
    """A new view reset from ``messages`` (run in a worker thread for long sessions)."""
    view = SessionView(keep_turns)
    view.reset(record, covers, messages, counter)
    return view


class SessionView:
    """The uncovered messages of one session (see the module docstring); synced by the manager."""

    def __init__(self, keep_turns: int) -> None:
        self.keep_turns = max(2, keep_turns)
        self.lock = asyncio.Lock()
        self.record: SessionRecord | None = None   # the record of the last sync
        self.valid = False
        self.covers = 0                             # summary covers_to_id the view is based on
        self.seen = 0                               # visible messages accounted for (covered ones too)
        self.last_id = 0                            # highest message id read
        self.ids: list[int] = []                    # uncovered messages, ascending
        self.roles: list[str] = []
        self.costs: list[int] = []
        self.starts: list[int] = []                 # positions where a turn (group) starts
        self.tail: list[Entry] = []                 # entries of positions tail_pos..
        self.tail_pos = 0
        self.memo: dict = {}                        # HistoryStore.read_loaded's conversions: tail re-reads reuse them

    # -- keeping it current ------------------------------------------------------------------------
    def reset(self, record: SessionRecord, covers: int, messages: list[ChatMessage], counter: TokenCounter) -> None:
        """Start over from ``messages`` = every visible message with id > ``covers``."""
        self.covers, self.seen, self.last_id = covers, record.message_count, covers
        self.ids, self.roles, self.costs, self.starts, self.tail, self.tail_pos = [], [], [], [], [], 0
        self.extend(messages, counter, count_seen=False)
        self.record, self.valid = record, True

    def adopt(self, other: SessionView) -> None:
        """Take over the contents of ``other`` (built off the event loop by ``built_view``) at once."""
        for name in _STATE:
            setattr(self, name, getattr(other, name))

    def extend(self, messages: list[ChatMessage], counter: TokenCounter, *, count_seen: bool = True) -> None:
        """Append newly stored messages (ascending, all above ``last_id``)."""
        for m in messages:
            e = expand(m, counter)
            pos = len(self.ids)
            if pos == 0 or m.role == "user":
                self.starts.append(pos)
            self.ids.append(m.id)
            self.roles.append(m.role)
            self.costs.append(e.cost)
            self.tail.append(e)
            self.last_id = m.id
        if count_seen:
            self.seen += len(messages)
        if len(self.starts) > self.keep_turns:       # keep entries of the newest keep_turns turns only
            cut = self.starts[-self.keep_turns]
            if cut > self.tail_pos:
                del self.tail[: cut - self.tail_pos]
                self.tail_pos = cut

    def append_stored(self, m: ChatMessage, counter: TokenCounter) -> bool:
        """Take ``m``, just stored by this process, as the session's next message without reading
        storage: only when the view is valid and ``m`` directly follows its last message (else
        False: sync it). ``record`` keeps the last sync's (its counts are one message behind until
        the next sync, which checks the whole tail again and rebuilds the view if anything else
        changed meanwhile)."""
        if not self.valid or m.id != self.last_id + 1 or m.role == "user":
            return False
        self.extend([m], counter)
        return True

    def read_from(self) -> int:
        """The id to read after: the cached tail is read again (to notice in-place updates)."""
        return self.tail[0].message.id - 1 if self.tail else self.last_id

    def merge(self, record: SessionRecord, messages: list[ChatMessage], counter: TokenCounter) -> bool:
        """Apply a read of every visible message with id > ``read_from()``: the tail again, then the
        new ones. False (nothing changed) when it does not fit: the caller rebuilds the view."""
        n = len(self.tail)
        if len(messages) < n or self.seen + len(messages) - n != record.message_count:
            return False
        for e, m in zip(self.tail, messages):
            if e.message.id != m.id or e.message.role != m.role:
                return False
        for i, m in enumerate(messages[:n]):
            old = self.tail[i].message
            if m is not old and m != old:            # updated in place: expand and count it again
                e = self.tail[i] = expand(m, counter)
                self.costs[self.tail_pos + i] = e.cost
        self.extend(messages[n:], counter)
        self.record = record
        return True

    def advance(self, covers: int) -> None:
        """A newer summary covers every message up to ``covers``: drop them."""
        k = bisect_right(self.ids, covers)
        self.covers = covers
        self.last_id = max(self.last_id, covers)     # never read covered messages as new ones
        if k == 0:
            return
        del self.ids[:k], self.roles[:k], self.costs[:k]
        self.starts = ([0] if self.ids else []) + [s - k for s in self.starts if s > k]
        if k > self.tail_pos:
            del self.tail[: k - self.tail_pos]
            self.tail_pos = 0
        else:
            self.tail_pos -= k

    @property
    def summary_applies(self) -> bool:
        """False when the summary covers only hidden (cleared) messages: every visible one is uncovered."""
        return self.seen > len(self.ids)

    # -- reading -------------------------------------------------------------------------------------
    def after(self, upto: int) -> list[ChatMessage] | None:
        """Every visible message with id > ``upto``, or None when the view does not hold them all."""
        if not self.valid or upto < self.covers or upto > self.last_id:
            return None
        p = bisect_right(self.ids, upto)
        if p < self.tail_pos:
            return None
        return [e.message for e in self.tail[p - self.tail_pos:]]

    def window(self, n: int, before_id: int, counter: TokenCounter) -> tuple[list[Turn], int] | None:
        """``context.recent_turns`` over the uncovered messages with id < ``before_id`` (all if 0):
        the newest ``n`` non-empty turns and how many older groups were left out. None when the
        cached tail is too short (the caller then reads storage)."""
        c = bisect_left(self.ids, before_id) if before_id > 0 else len(self.ids)
        g = bisect_left(self.starts, c)               # groups among positions [0, c)
        out: list[Turn] = []
        i = g
        while i > 0 and len(out) < n:
            i -= 1
            start, end = self.starts[i], (self.starts[i + 1] if i + 1 < g else c)
            if start < self.tail_pos:
                return None
            entries = self.tail[start - self.tail_pos:end - self.tail_pos]
            joined = [x for e in entries for x in e.expanded]
            if not joined:
                continue
            expanded = sanitize(joined)               # each piece is paired already: no change expected
            if expanded == joined:
                tokens = sum(e.cost for e in entries)
            else:
                tokens = sum(message_tokens(counter, x) for x in expanded)
            out.append(Turn([dict(x) for x in expanded], [e.message.id for e in entries], tokens))
        out.reverse()
        return out, i

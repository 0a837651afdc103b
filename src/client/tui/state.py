"""ChatState: what the chat of the current session shows, decided without I/O and without Textual.

It owns the current session, the live (running) turns and the queued turns. The controller feeds it
what the server said (typed events and replies); each call returns the ``Change`` list the chat
view must render, in order. So the rules live here and are unit-tested without a terminal:

- events of another session are ignored;
- TURN_START settles the turn's queued user message (or shows it) and opens the live answer;
- deltas are appended from the shown length on (a reattached turn drops what it already shows);
- TURN_END settles the answer into its stored message, keeping the streamed text when the server
  cut the stored copy to fit ``max_message_size``, or stored it partial with less text (another
  cluster node closed the turn of a node that died: the text is marked ``NOT_SAVED``); a withdrawn
  queued turn just disappears;
- TURN_ERROR keeps what was streamed and shows the error on it;
- a reload of the shown session (after a reconnect, say) keeps the text a live turn streamed when
  the server stored its answer partial and shorter (a crash lost the end): ``reloaded``; that text
  is kept until a reload has shown it (a reload that fails does not lose it).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Iterable, Union

from protocol.objects import ChatMessage, SessionInfo, ToolCall, TurnState
from protocol.replies import ChatSendReply, HistoryPageReply
from protocol.server_events import (AnswerDelta, ToolCallEvent, ToolResultEvent, TurnEnd, TurnError, TurnEvent,
                                    TurnStart, TurnStatus)


#: metadata the TUI adds (never stored) to a partial answer it shows with the text it streamed, longer
#: than what the server saved: the number of characters the server kept
NOT_SAVED = "tui_saved_chars"


def keep_streamed(message: ChatMessage, text: str) -> ChatMessage:
    """``message`` as it is to be shown after this client streamed ``text`` for it: when the server
    stored it ``partial`` with less text (the server or its cluster node stopped before it saved the
    end), the streamed text, marked ``NOT_SAVED`` with the length the server kept. The user read
    that text: it is not replaced by less."""
    if not message.metadata.get("partial") or len(text) <= len(message.content):
        return message
    return replace(message, content=text, metadata={**message.metadata, NOT_SAVED: len(message.content)})


def now_iso() -> str:
    """Current time, ISO 8601 UTC (timestamps of live messages before the server's arrive)."""
    return datetime.now(timezone.utc).isoformat()


# -- the changes the view renders ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ShowMessage:
    """Append a stored message (above the queued ones); a message already shown is not repeated."""
    message: ChatMessage


@dataclass(frozen=True, slots=True)
class OpenAnswer:
    """Open the live answer of a turn (``message``: the content and tool calls so far)."""
    turn_id: str
    message: ChatMessage


@dataclass(frozen=True, slots=True)
class AppendAnswer:
    turn_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ShowTool:
    """Add a tool call to the live answer, or update it (same ``call.id``)."""
    turn_id: str
    call: ToolCall


@dataclass(frozen=True, slots=True)
class EndAnswer:
    """The turn ended: settle its answer into ``message`` (None: keep what was streamed), show ``error``."""
    turn_id: str
    message: ChatMessage | None
    finish_reason: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ShowQueued:
    """Show the user message of a queued turn at the very bottom."""
    turn_id: str
    message: ChatMessage


@dataclass(frozen=True, slots=True)
class SettleQueued:
    """A queued turn started (``message``: its stored user message) or was withdrawn (None)."""
    turn_id: str
    message: ChatMessage | None


@dataclass(frozen=True, slots=True)
class StatusChanged:
    """The turn status line: None when nothing runs."""
    status: str | None
    detail: str | None = None


Change = Union[ShowMessage, OpenAnswer, AppendAnswer, ShowTool, EndAnswer, ShowQueued, SettleQueued, StatusChanged]


# -- the state -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class LiveTurn:
    """A running turn of the shown session: the answer text streamed so far (``user_id``: the id of
    its stored user message, when known)."""
    turn_id: str
    content: str = ""
    user_id: int | None = None


@dataclass(slots=True)
class ChatState:
    """The shown session, its live turns (oldest first) and its queued turns (in order)."""
    session: SessionInfo | None = None
    live: dict[str, LiveTurn] = field(default_factory=dict)
    queued: dict[str, ChatMessage] = field(default_factory=dict)
    status: StatusChanged = field(default_factory=lambda: StatusChanged(None))
    # text live turns had streamed when the shown session began reloading, by their user message id
    streamed: dict[int, str] = field(default_factory=dict)

    @property
    def session_id(self) -> str | None:
        return self.session.session_id if self.session is not None else None

    @property
    def live_turn(self) -> str | None:
        """The newest live turn (the one Esc cancels)."""
        return next(reversed(self.live), None)

    # -- session ------------------------------------------------------------------------------------
    def begin(self, session: SessionInfo) -> list[Change]:
        """A session is being shown from scratch: nothing live, nothing queued. When it is the session
        already shown (a reload), what its live turns streamed is kept for ``reloaded``, together with
        what an earlier reload that did not get to show its page kept."""
        if session.session_id != self.session_id:
            self.streamed = {}
        else:
            self.streamed.update({t.user_id: t.content for t in self.live.values()
                                  if t.user_id is not None and t.content})
        self.session = session
        self.live.clear()
        self.queued.clear()
        return [self._status(None)]

    def session_changed(self, session: SessionInfo) -> bool:
        """A newer state of a session; True when it is the shown one."""
        if session.session_id != self.session_id:
            return False
        self.session = session
        return True

    def reloaded(self, page: HistoryPageReply) -> HistoryPageReply:
        """The newest page of a reloaded session, as it is to be shown: the answer of a turn that was
        live before the reload keeps the text this client streamed when the server stored less
        (``keep_streamed``: it was killed before it saved the end)."""
        streamed, self.streamed = self.streamed, {}
        if not streamed or not isinstance(page.messages, tuple):
            return page
        out: list[ChatMessage] = []
        text: str | None = None          # what the turn of the last user message streamed
        for message in page.messages:
            if message.role == "user":
                text = streamed.get(message.id) if message.id is not None else None
            elif message.role == "assistant" and text is not None:
                message, text = keep_streamed(message, text), None
            out.append(message)
        return replace(page, messages=tuple(out))

    def attach(self, turn: TurnState) -> list[Change]:
        """Reattach to the session's running turn: its user message, the answer so far, its queue."""
        changes: list[Change] = [ShowMessage(turn.user_message)]
        if turn.turn_id not in self.live:
            self.live[turn.turn_id] = LiveTurn(turn.turn_id, turn.content, turn.user_message.id)
            changes.append(OpenAnswer(turn.turn_id, ChatMessage(None, "assistant", turn.content,
                                                                turn.started_at or now_iso(), turn.tool_calls)))
        for queued in turn.queued:
            changes += self._queue(queued.turn_id, queued.user_message)
        changes.append(self._status(turn.status or "thinking"))
        return changes

    def sent(self, reply: ChatSendReply) -> list[Change]:
        """The reply to our chat send: the user message is stored (shown) or queued (shown at the bottom)."""
        if reply.session_id != self.session_id:
            return []
        changes: list[Change] = []
        if reply.user_message.id is not None:
            changes.append(ShowMessage(reply.user_message))
        elif reply.turn_id not in self.live:
            changes += self._queue(reply.turn_id, reply.user_message)
        if reply.queued and not self.live:
            changes.append(self._status("queued", f"{reply.queued} ahead"))
        return changes

    # -- turn events --------------------------------------------------------------------------------
    def apply(self, event: TurnEvent) -> list[Change]:
        """One turn event (events of other sessions change nothing)."""
        if event.session_id != self.session_id:
            return []
        turn_id = event.turn_id
        match event:
            case TurnStart(user_message=message):
                changes: list[Change] = []
                if turn_id in self.queued:
                    del self.queued[turn_id]
                    changes.append(SettleQueued(turn_id, message))
                else:
                    changes.append(ShowMessage(message))
                changes += self._open(turn_id)
                self.live[turn_id].user_id = message.id
                return changes + [self._status("thinking")]
            case TurnStatus(status=status, detail=detail):
                return [self._status(status or "thinking", detail)]
            case ToolCallEvent(call=call) | ToolResultEvent(call=call):
                return self._open(turn_id) + [ShowTool(turn_id, call)]
            case AnswerDelta():
                return self.apply_deltas([event])
            case TurnEnd(withdrawn=True):
                if self.queued.pop(turn_id, None) is None:
                    return []
                return [SettleQueued(turn_id, None)]
            case TurnEnd(message=message, finish_reason=reason):
                live = self.live.pop(turn_id, None)
                if message is not None and live is not None:
                    if event.truncated and len(live.content) > len(message.content):
                        # the server cut the stored answer to fit max_message_size: keep the streamed text
                        message = replace(message, content=live.content)
                    else:   # stored partial with less (a cluster node closed a dead node's turn, say)
                        message = keep_streamed(message, live.content)
                return self._idle() + [EndAnswer(turn_id, message, reason)]
            case TurnError(code=code, message=text, partial_message=partial):
                self.live.pop(turn_id, None)
                return self._idle() + [EndAnswer(turn_id, partial, None, f"Error {code}: {text}")]
        return []

    def apply_deltas(self, deltas: Iterable[AnswerDelta]) -> list[Change]:
        """Consecutive deltas of one turn as one append (what is already shown is dropped)."""
        deltas = list(deltas)
        if not deltas or deltas[0].session_id != self.session_id:
            return []
        turn_id = deltas[0].turn_id
        changes = self._open(turn_id)
        live = self.live[turn_id]
        text = join_deltas(len(live.content), deltas)
        if text:
            live.content += text
            changes.append(AppendAnswer(turn_id, text))
        return changes

    # -- helpers ------------------------------------------------------------------------------------
    def _open(self, turn_id: str) -> list[Change]:
        if turn_id in self.live:
            return []
        self.live[turn_id] = LiveTurn(turn_id)
        return [OpenAnswer(turn_id, ChatMessage(None, "assistant", "", now_iso()))]

    def _queue(self, turn_id: str, message: ChatMessage) -> list[Change]:
        if turn_id in self.queued:
            return []
        self.queued[turn_id] = message
        return [ShowQueued(turn_id, message)]

    def _idle(self) -> list[Change]:
        return [] if self.live else [self._status(None)]

    def _status(self, status: str | None, detail: str | None = None) -> StatusChanged:
        self.status = StatusChanged(status, detail)
        return self.status


def join_deltas(shown: int, deltas: Iterable[AnswerDelta]) -> str:
    """The text to append after ``shown`` characters, exactly as appending each delta in turn would.

    A delta whose ``offset + len(text)`` is not past the shown length is a duplicate (a reattached
    turn re-sends what the page already showed) and is dropped; an overlapping one keeps its tail.
    """
    parts: list[str] = []
    for delta in deltas:
        text, offset = delta.text, delta.offset
        if offset + len(text) > shown:
            piece = text[max(0, shown - offset):]
            parts.append(piece)
            shown += len(piece)
    return "".join(parts)

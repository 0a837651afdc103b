"""Session access shared by the v3 handlers and the legacy v2 adapter.

Every lookup checks ownership: a session of another user, a deleted one, a malformed id and a missing
one all give the same ``NOT_FOUND``, so ids never leak. SessionInfo bodies are built here.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Callable, Protocol

from protocol import ErrorCode
from protocol.objects import SessionInfo
from protocol.server_events import SessionEvent
from server.agent.titles import TITLE_CHARS, title_from_message
from server.errors import HandlerError, not_found
from server.hub import Hub, Subscriber
from server.session_quota import SessionQuota
from server.wire import summary_obj
from storage.errors import InvalidSessionId, NotFound, StorageClosed
from storage.models import ChatMessage, SessionRecord
from storage.store import DEFAULT_TITLE

log = logging.getLogger(__name__)

EMPTY_SCAN = 50           # newest sessions looked at for an empty one to reuse
#: A delete or clear waits at most this long (seconds) for the session's cancelled turns to end, on
#: this node and, in a cluster, on the others (their TURN_END), so their partial answers are stored
#: before it. In a cluster a turn of another node that has not ended by then must let go of the
#: session's lock within ``[cluster] ending_turn_wait_ms`` or the delete or clear is refused
#: QUEUE_FULL (``TurnControl.quiet``).
TURN_STOP_WAIT_S = 10.0


def auto_title(text: str) -> str:
    """A session title from the first user message: one line, at most ~TITLE_CHARS characters, no Markdown."""
    return title_from_message(text, TITLE_CHARS)


def needs_title(rec: SessionRecord) -> bool:
    """True while a session still has no title of its own."""
    return untitled(rec.title)


def untitled(title: str) -> bool:
    """True for the title of a session that has none of its own yet."""
    return not title or title == DEFAULT_TITLE


class TurnControl(Protocol):
    """What sessions need of the turn runner (``server.turns.TurnRunner``)."""

    def is_running(self, session_id: str) -> bool: ...
    def cancel_session(self, session_id: str, reason: str = ..., *, withdraw: bool = ...) -> None: ...
    async def settle(self, session_id: str, timeout: float = ...) -> None: ...
    # optional (a cluster: server.cluster_cancel.TurnControlAcrossNodes): an async context manager
    # inside which no turn of any node can store into the session, or HandlerError if none can be had
    # quiet(session_id, action) -> AsyncContextManager[None]


def check_system_prompt(prompt: str | None) -> None:
    """INVALID_MESSAGE for a system prompt of whitespace only: stored, it would replace the server's
    system prompt with nothing. "" (and None) stay the documented reset to the server's."""
    if prompt and not prompt.strip():
        raise HandlerError(ErrorCode.INVALID_MESSAGE,
                           "field 'system_prompt': expected text, got only whitespace "
                           "(\"\" resets the session to the server's system prompt)")


class SessionService:
    """Ownership-checked session operations over the AsyncHistoryStore.

    ``turns`` is set once the turn runner exists (the runner is built on this service).
    """

    def __init__(self, store: Any, hub: Hub, agent: Any, memory: Any, limits: Any = None) -> None:
        self.store = store
        self.hub = hub
        self.agent = agent
        self.memory = memory
        self.quota = SessionQuota(store, limits)   # [limits] max_sessions_per_user
        self.turns: TurnControl | None = None

    @property
    def max_sessions(self) -> int:
        """``[limits] max_sessions_per_user`` (``build_services`` gives the server's limits; a service
        built without them has the default)."""
        return self.quota.max_sessions

    def model_of(self, rec: SessionRecord) -> str:
        """The session's model, or the agent's default when unset or no longer offered."""
        return self.model_named(rec.model)

    def model_named(self, model: str | None) -> str:
        """``model`` (a session's setting) if the agent offers it, else the agent's default."""
        agent = self.agent
        return model if model and model in agent.models() else agent.default_model

    def info(self, rec: SessionRecord, *, summary: bool = False) -> SessionInfo:
        """The SessionInfo object of docs/protocol.md §3 (``summary`` only when asked)."""
        s = rec.summary if summary else None
        running = self.turns is not None and self.turns.is_running(rec.session_id)
        return SessionInfo(rec.session_id, rec.title, rec.created_at, rec.updated_at, rec.message_count,
                           rec.preview, self.model_of(rec), running, summary_obj(s) if s is not None else None)

    async def owned(self, user_id: str, session_id: Any) -> SessionRecord:
        """The user's live session ``session_id`` or NOT_FOUND."""
        if not isinstance(session_id, str) or not session_id:
            raise not_found()
        try:
            rec = await self.store.get(session_id)
        except (NotFound, InvalidSessionId):
            raise not_found() from None
        if rec.user_id != user_id or rec.deleted:
            raise not_found()
        return rec

    async def owned_any(self, user_id: str, session_id: Any) -> SessionRecord:
        """The user's session ``session_id``, deleted (in the trash) or not, or NOT_FOUND."""
        if not isinstance(session_id, str) or not session_id:
            raise not_found()
        try:
            rec = await self.store.get(session_id)
        except (NotFound, InvalidSessionId):
            raise not_found() from None
        if rec.user_id != user_id:
            raise not_found()
        return rec

    async def create(self, user_id: str, title: str | None = None) -> SessionRecord:
        """A new session; without a title it is "New chat" until the first message names it.

        Every path that makes a session comes here (SESSION_NEW, a CHAT_TEXT's new session, v2's
        SESSION_NEW and greeting, a move after a delete): past ``max_sessions_per_user`` sessions,
        those in the trash included, it is refused QUOTA_EXCEEDED (``session_quota``)."""
        async with self.quota.creating(user_id):
            return await self.store.create(user_id, title=title.strip() if title else None)

    async def fresh(self, user_id: str, title: str | None = None, system_prompt: str | None = None,
                    exclude: str | None = None) -> tuple[SessionRecord, bool]:
        """A session to start a chat in: without a title, the user's empty untitled session when
        there is one other than ``exclude`` (the requester's current session: asking for a new chat
        never answers with the one you are in), so empty "New chat" sessions do not pile up; else a
        new one ("New chat" until the first message names it). Second item: whether it was created.
        A blank ``system_prompt`` is refused (``check_system_prompt``) before anything is made; ""
        means none."""
        check_system_prompt(system_prompt)
        system_prompt = system_prompt or None
        if not title:
            rec = await self.empty_session(user_id, exclude)
            if rec is not None:
                if rec.system_prompt != system_prompt:
                    rec = await self.store.set_system_prompt(rec.session_id, system_prompt)
                return rec, False
        rec = await self.create(user_id, title)
        if system_prompt is not None:
            rec = await self.store.set_system_prompt(rec.session_id, system_prompt)
        return rec, True

    async def empty_session(self, user_id: str, exclude: str | None = None) -> SessionRecord | None:
        """The user's newest live session with no message, no title of its own and no turn (other
        than ``exclude``)."""
        recs, _ = await self.store.list(user_id, limit=EMPTY_SCAN)
        for r in recs:
            if r.session_id == exclude:
                continue
            if r.message_count == 0 and needs_title(r) and not (self.turns and self.turns.is_running(r.session_id)):
                rec = await self.store.get(r.session_id)
                if rec.message_count == 0 and not rec.deleted and needs_title(rec):
                    return rec
        return None

    async def restore(self, user_id: str, session_id: Any) -> SessionRecord:
        """A deleted session of the user back out of the trash (a live one is returned as it is)."""
        rec = await self.owned_any(user_id, session_id)
        if not rec.deleted:
            return rec
        rec = await self.store.undelete(rec.session_id)
        await self.publish_event("restored", rec)
        return rec

    async def purge(self, user_id: str, session_id: Any, requester: Subscriber | None = None) -> SessionRecord:
        """Remove one of the user's sessions for good: deleted first when it is live (``delete``),
        then its files or rows, its recall index and cached view. Returns its last record."""
        rec = await self.owned_any(user_id, session_id)
        if not rec.deleted:
            rec = await self.delete(user_id, rec.session_id, requester)
        await self.begin_forget(rec.session_id, rec.user_id)
        try:
            await self.store.purge(rec.session_id)
        finally:
            self.forget(rec.session_id, rec.user_id)
        self.quota.counted(rec.user_id, -1)
        await self.publish_event("purged", rec)
        return rec

    async def set_system_prompt(self, session_id: str, prompt: str | None) -> SessionRecord:
        """Set (or with None or "" reset to the server's) the system prompt of a checked session; a
        blank one is refused (``check_system_prompt``)."""
        check_system_prompt(prompt)
        rec = await self.store.set_system_prompt(session_id, prompt or None)
        await self.publish_event("updated", rec)
        return rec

    async def newest(self, user_id: str) -> SessionRecord | None:
        recs, _ = await self.store.list(user_id, limit=1)
        return recs[0] if recs else None

    async def newest_or_new(self, user_id: str) -> tuple[SessionRecord, bool]:
        """The most recently updated session of the user, or a new one (second item: created)."""
        rec = await self.newest(user_id)
        if rec is not None:
            return rec, False
        return await self.create(user_id), True

    async def list_all(self, user_id: str, page: int = 200) -> list[SessionRecord]:
        """Every live session of the user, newest first (used by v2 prefix matching)."""
        out: list[SessionRecord] = []
        before: str | None = None
        while True:
            recs, before = await self.store.list(user_id, before=before, limit=page)
            out.extend(recs)
            if before is None or not recs:
                return out

    async def resolve(self, user_id: str, ref: str) -> SessionRecord:
        """A full id or an unambiguous prefix of one of the user's session ids."""
        ref = ref.strip()
        if not ref:
            raise HandlerError(ErrorCode.INVALID_MESSAGE, "no session id given")
        try:
            return await self.owned(user_id, ref)
        except HandlerError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
            # not a whole id of the user's: try it as a prefix
        matches = [r for r in await self.list_all(user_id) if r.session_id.startswith(ref)]
        if not matches:
            raise not_found()
        if len(matches) > 1:
            raise HandlerError(ErrorCode.INVALID_MESSAGE, f"session prefix {ref!r} is ambiguous ({len(matches)} sessions)")
        return matches[0]

    async def delete(self, user_id: str, session_id: Any, requester: Subscriber | None = None) -> SessionRecord:
        """Soft-delete one of the user's sessions: its turns are cancelled (queued ones withdrawn), and
        every subscriber attached to it moves to the user's newest remaining session (or a new one)
        and is told (``session_moved``), except ``requester``, which gets its own reply."""
        rec = await self.owned(user_id, session_id)
        # (the cancelled turn's TURN_END reaches the attached subscribers before they are moved)
        async with self.turns_stopped(rec.session_id, "deleted"):
            await self.begin_forget(rec.session_id, rec.user_id)
            try:
                deleted = await self.store.delete(rec.session_id)
            finally:
                self.forget(rec.session_id, rec.user_id)
            await self.publish_event("deleted", deleted)
        await self.move_attached(rec.user_id, rec.session_id, requester)
        return deleted

    async def move_attached(self, user_id: str, session_id: str, requester: Subscriber | None = None) -> None:
        """Move every subscriber attached to the deleted ``session_id`` to the user's newest remaining
        session and tell it (``session_moved``), except ``requester``. When none is left, v3
        connections are left without a session (as after a HELLO that found none: deleting the last
        session never creates one) and only a v2 connection, whose commands need one, gets a new
        one (they all move there then). Also called when another server node deleted the session
        (``server.cluster_cancel``)."""
        attached = [s for s in self.hub.session_subscribers(session_id) if not s.closed]
        if attached:
            current = await self.newest(user_id)
            if current is None and any(s.needs_session for s in attached):
                try:
                    current = await self.create(user_id)
                except HandlerError as exc:   # (over max_sessions_per_user: left without a session,
                    if exc.code != ErrorCode.QUOTA_EXCEEDED:   # a v2 client is told at its next request)
                        raise
                else:
                    await self.publish_event("created", current)
            for sub in attached:
                if sub.session_id != session_id or sub.closed:
                    continue  # it moved by itself meanwhile
                if current is None:
                    self.hub.detach(sub)
                    continue
                self.hub.attach(sub, current.session_id)
                if sub is not requester:
                    sub.session_moved(session_id, current.session_id)

    async def clear(self, rec: SessionRecord, purge: bool = False) -> tuple[SessionRecord, int]:
        """Hide every message of session ``rec`` (checked by the caller) and drop its summaries (with
        ``purge`` the hidden messages are removed for good); a running turn is cancelled and
        queued ones withdrawn first, so no answer lands in the cleared session without its question."""
        session_id, user_id = rec.session_id, rec.user_id
        async with self.turns_stopped(session_id, "cleared"):
            await self.begin_forget(session_id, user_id)
            try:
                cleared = await self.store.clear(session_id, purge=purge)
            finally:            # what the session taught is forgotten even if the clear failed
                self.forget(session_id, user_id)
            rec = await self.store.get(session_id)
            await self.publish_event("cleared", rec)
        return rec, cleared

    @contextlib.asynccontextmanager
    async def turns_stopped(self, session_id: str, reason: str) -> AsyncIterator[None]:
        """Around a delete or clear: the session's running turn is cancelled (``reason``) and its
        queued ones withdrawn, on every node, and their end awaited (at most ``TURN_STOP_WAIT_S``), so
        their partial answers are stored before it. In a cluster, if a turn of another node has not
        ended by then (its node frozen, or its TURN_END late), the body runs holding the session's
        lock, which that turn holds until it has stored its answer, so no answer lands after the
        delete or clear; QUEUE_FULL if the lock cannot be had (``TurnControl.quiet``)."""
        runner = self.turns
        if runner is not None and runner.is_running(session_id):
            runner.cancel_session(session_id, reason=reason)
            await runner.settle(session_id, TURN_STOP_WAIT_S)
        quiet = getattr(runner, "quiet", None)
        if quiet is None:
            yield
        else:
            async with quiet(session_id, reason):
                yield

    async def begin_forget(self, session_id: str, user_id: str) -> None:
        """Before a clear, delete or purge: the long-term memory notes durably that what it learned
        from the session is being forgotten (``forget`` with ``user_id`` ends it), so a crash in
        between cannot bring it back (docs/memory.md, "Honest clear")."""
        begin = getattr(self.memory, "begin_forget", None)
        if begin is not None:
            await begin(session_id, user_id)

    async def before_supersede(self, session_id: str, user_id: str, messages: list[ChatMessage]) -> None:
        """Before a regenerate or an edit supersedes ``messages``: the memory layer takes back what it
        made of them (long-term memory items, a summary covering them; docs/memory.md). The
        regenerate or edit fails if that fails: nothing is superseded then."""
        before = getattr(self.memory, "before_supersede", None)
        if before is not None:
            await before(session_id, user_id, messages)

    def forget(self, session_id: str, user_id: str | None = None) -> None:
        """Tell the memory layer a session changed under it: its recall index is rebuilt. With
        ``user_id`` (clear, delete, purge) the user's long-term memory also drops what it learned
        from the session (a restore does not bring that back)."""
        forget = getattr(self.memory, "forget_session", None)
        if forget is not None:
            if user_id is None:
                forget(session_id)
            else:
                forget(session_id, user_id, cleared=True)

    async def publish_event(self, kind: str, rec: SessionRecord, *, summary: bool = False) -> None:
        """SESSION_EVENT to every connection of the session's owner (v2 ones ignore it)."""
        self.hub.publish_user(rec.user_id, SessionEvent(kind, self.info(rec, summary=summary)))

    def publish_updated_soon(self, session_id: str, spawn: Callable[[Any], None]) -> None:
        """``publish_updated`` at once when the store has the record in memory (``get_loaded``: no
        task, no thread hop, so the event leaves in the same write as the turn's own events), else
        in a background task started with ``spawn``."""
        get_loaded = getattr(self.store, "get_loaded", None)
        rec = get_loaded(session_id) if get_loaded is not None else None
        if rec is None:
            spawn(self.publish_updated(session_id))
        elif not rec.deleted:
            self.hub.publish_user(rec.user_id, SessionEvent("updated", self.info(rec)))

    async def publish_updated(self, session_id: str, kind: str = "updated") -> None:
        """Re-read the record and publish it; silently skipped if the session vanished."""
        try:
            rec = await self.store.get(session_id)
        except (NotFound, InvalidSessionId):
            return
        except StorageClosed:  # the server is stopping: its subscribers are being closed too
            log.debug("session %s: %s event skipped, the store is closed", session_id, kind)
            return
        if not rec.deleted:
            await self.publish_event(kind, rec, summary=kind == "summary")

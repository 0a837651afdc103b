"""Download offers: the assistant hands a knowledge-base document to the user's client.

``offer(user, doc_id, subscriber)`` sends one offer to one connection:

- a v2 connection that registered a UDP port (``CLIENT_UDP_PORT``; ``register_v2``) gets
  ``DOWNLOAD_OFFER`` (0x0C) JSON ``{filename, size, checksum, download_token, server_host, server_port}``
  and the bytes over UDP (``server.udp_transfer``), to (its TCP peer address, its UDP port), for as
  long as that connection stays open (the transfer stops and frees its slot when it closes; its ACK
  progress counts as the connection's activity for the idle timeout);
- any other subscriber (a v3 port) gets the ``DOWNLOAD_OFFER_V3`` event (0x4F) ``{doc_id, filename,
  size, md5}`` and fetches the document over its TCP connection with the KB download request.

``offer_in_session`` is what the ``offer_download`` tool calls: it finds the document by id or name
among those the user can read, and offers it to the connection that started the session's running
turn (the one the assistant is answering), or, with no running turn, to every connection of the user
attached to the session. A document outside the user's collections is ``NOT_FOUND``, like a missing one.
"""
from __future__ import annotations

import logging
import secrets
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Collection, Protocol

import orjson

from protocol import ErrorCode
from protocol.server_events import DownloadOfferV3
from server.errors import HandlerError
from server.knowledge.access import readable
from server.knowledge.names import name_key
from server.hub import Hub, Outgoing
from server.udp_transfer import UdpTransfer
from server.v3_port import V3Port

log = logging.getLogger("nplt.offers")

MAX_NAMES_LISTED = 10


ECHO_CHARS = 64           # a name quoted back from the request is cut to this many characters


def quoted(text: str, n: int = ECHO_CHARS) -> str:
    """``text`` (client input: a document name asked for) as a refusal quotes it: cut to ``n``
    characters and in Python's repr, as v3 errors quote input, so tabs, zero-width and other
    invisible characters show escaped ("'a\\u200b.txt'") instead of passing unseen."""
    return repr(text if len(text) <= n else text[:n] + "…")


def candidate(d: Any) -> str:
    """One of several documents sharing a name, as the refusal lists it: its id, collection, size,
    upload time to the second and the first 8 hex digits of its MD5 (what tells two copies apart)."""
    return (f"{d.doc_id} ({d.collection}, {d.size} bytes, uploaded {d.uploaded_at[:19].replace('T', ' ')}, "
            f"MD5 {d.md5[:8]})")


class V2OfferTarget(Protocol):
    """A v2 connection that can receive UDP downloads (server.legacy_v2_files)."""

    @property
    def closed(self) -> bool: ...
    def udp_address(self) -> tuple[str, int] | None: ...     # (TCP peer host, registered UDP port)
    def local_host(self) -> str | None: ...                  # the server address the client connected to
    def send_offer(self, payload: bytes) -> None: ...         # one DOWNLOAD_OFFER frame
    def note_activity(self) -> None: ...                      # the download moved: the connection is active
    def when_closed(self, callback: Callable[[], None]) -> Callable[[], None]: ...   # the transfer's end


class TurnLookup(Protocol):
    def running(self, session_id: str) -> Any: ...            # a Turn (user_id, origin) or None


@dataclass(frozen=True, slots=True)
class OfferResult:
    doc_id: str
    filename: str
    size: int
    md5: str
    via: str                       # "udp" (v2) or "tcp" (v3 event)

    def to_dict(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "filename": self.filename, "size": self.size, "md5": self.md5,
                "via": self.via}


class OfferService:
    """Offers documents of the knowledge base to connections (see the module docstring)."""

    def __init__(self, kb: Any, hub: Hub, udp: UdpTransfer | None,
                 groups_of: Callable[[str], Collection[str]] | None = None) -> None:
        self.kb = kb
        self.hub = hub
        self.udp = udp
        self.groups_of = groups_of or (lambda user: ())     # a user's knowledge-base groups
        self.turns: TurnLookup | None = None       # set once the turn runner exists (server.services)
        self._v2: weakref.WeakKeyDictionary[Any, V2OfferTarget] = weakref.WeakKeyDictionary()

    def register_v2(self, subscriber: Any, target: V2OfferTarget) -> None:
        """``subscriber`` (a v2 adapter) receives offers through ``target`` from now on."""
        self._v2[subscriber] = target

    # -- finding a document --------------------------------------------------------------------------
    async def find(self, user: str, groups: Collection[str], doc_id: str | None = None,
                   name: str | None = None) -> Any:
        """The DocumentInfo named by id, or by file name (exact, then case-insensitive, then a unique
        part of a name; names compared in Unicode NFC, so "résumé.txt" typed (NFC) finds the one a
        macOS client uploaded (NFD): names are stored as given); NOT_FOUND lists
        the user's document names. A name that different documents share (a user's and a group's
        "notes.md", or two spellings of one name) is refused with their ids, as ``kb download``
        does: the newest is not guessed."""
        if self.kb is None:
            raise HandlerError(ErrorCode.NOT_FOUND, "this server has no knowledge base")
        if doc_id:
            return await self.kb.get(user, groups, doc_id)
        can_read = set(readable(user, groups))   # (list also has the user's uploads in groups they left)
        docs = [(d, name_key(d.name)) for d in await self.kb.list(user, groups) if d.collection in can_read]
        ref = name_key((name or "").strip())
        for match in (lambda d, key: key == ref, lambda d, key: key.lower() == ref.lower(),
                      lambda d, key: d.doc_id == ref):
            found = [d for d, key in docs if match(d, key)]
            if len({d.md5 for d in found}) > 1:   # two different documents of that name: the user picks
                ids = "; ".join(candidate(d) for d in found[:MAX_NAMES_LISTED])
                raise HandlerError(ErrorCode.NOT_FOUND, f"{len(found)} different documents are named "
                                   f"{quoted(ref)}: ask for one by its id: {ids}")
            if found:
                return found[0]            # (one document, or copies of the same bytes)
        part = [(d, key) for d, key in docs if ref and ref.lower() in key.lower()]
        if len({key for _, key in part}) == 1:
            return part[0][0]
        if part:
            names = ", ".join(sorted({d.name for d, _ in part})[:MAX_NAMES_LISTED])
            raise HandlerError(ErrorCode.NOT_FOUND, f"{quoted(ref)} matches several documents: {names}")
        names = ", ".join(d.name for d, _ in docs[:MAX_NAMES_LISTED]) or "none"
        raise HandlerError(ErrorCode.NOT_FOUND, f"no document named {quoted(ref)} (documents: {names})")

    # -- offering ------------------------------------------------------------------------------------
    async def offer(self, user: str, doc_id: str, subscriber: Any, groups: Collection[str] = ()) -> OfferResult:
        """Offer document ``doc_id`` to one connection. HandlerError: NOT_FOUND, QUOTA_EXCEEDED (over
        64 MiB for UDP), SERVER_BUSY (UDP downloads busy or off), INVALID_MESSAGE (no UDP port)."""
        info = await self.kb.get(user, groups, doc_id)
        if isinstance(subscriber, V3Port):
            event = DownloadOfferV3(info.doc_id, info.name, info.size, info.md5)
            subscriber.event(Outgoing(event))
            return OfferResult(info.doc_id, info.name, info.size, info.md5, "tcp")
        target = self._v2.get(subscriber)
        addr = target.udp_address() if target is not None else None
        if target is None or addr is None:
            raise HandlerError(ErrorCode.INVALID_MESSAGE, "the client has not announced a UDP port "
                                                          "(CLIENT_UDP_PORT), so it cannot receive downloads")
        if self.udp is None:
            raise HandlerError(ErrorCode.SERVER_BUSY, "UDP downloads are not available on this server")
        self.udp.check(addr, info.size)
        info, f = await self.kb.open_document(user, groups, doc_id)
        token = secrets.token_hex(16)
        udp_host = self.udp.host
        if udp_host in ("0.0.0.0", "::", ""):
            udp_host = target.local_host() or udp_host
        payload = orjson.dumps({"filename": info.name, "size": info.size, "checksum": info.md5,
                                "download_token": token, "server_host": udp_host, "server_port": self.udp.port})
        try:
            if target.closed:
                raise HandlerError(ErrorCode.NOT_FOUND, "the connection closed")
            target.send_offer(payload)
            # ends when the connection closes; its ACK progress keeps the connection from idling out
            self.udp.send(addr, f, info.size, token, owner=target, on_progress=target.note_activity)
        except BaseException:
            f.close()
            raise
        log.info("offered %s (%d bytes) to %s:%d over UDP (token %s)", info.doc_id, info.size, *addr, token)
        return OfferResult(info.doc_id, info.name, info.size, info.md5, "udp")

    async def offer_in_session(self, user: str, session_id: str | None, doc_id: str | None = None,
                               name: str | None = None) -> dict[str, Any]:
        """The tool's entry point: find the document, offer it to the turn's connection (see above)."""
        groups = tuple(self.groups_of(user))
        info = await self.find(user, groups, doc_id, name)
        targets = self._targets(user, session_id)
        if not targets:
            raise HandlerError(ErrorCode.NOT_FOUND, "no connection of the user is attached to this session")
        results = [await self.offer(user, info.doc_id, sub, groups) for sub in targets]
        return {**results[0].to_dict(), "offered_to": len(results), "via": sorted({r.via for r in results})}

    def _targets(self, user: str, session_id: str | None) -> list[Any]:
        if session_id is None:
            return []
        turn = self.turns.running(session_id) if self.turns is not None else None
        origin = getattr(turn, "origin", None)
        if origin is not None and getattr(turn, "user_id", None) == user and not origin.closed:
            return [origin]
        # a session's subscribers are its owner's connections (attaching is ownership-checked)
        return [s for s in self.hub.session_subscribers(session_id) if not s.closed]

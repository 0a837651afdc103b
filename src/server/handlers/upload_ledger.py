"""What each user has reserved with their partial uploads (docs/protocol.md §5.8), and what to drop
to make room for one more.

Every partial upload on this node's disk — attached to a connection, detached (waiting for a resume),
or being stored after END — counts toward its user's ``max_uploads_per_user`` and, by its declared
size, toward their ``user_quota_bytes``. To fit a new BEGIN, the user's least recently touched
detached partials are chosen to be dropped; the ones in use (attached or being stored) never are.

A v2 upload (``server.legacy_v2_files``: FILE_METADATA to its last FILE_DATA) is recorded here too,
*held* (``hold``): by its declared size from its metadata until it ends (stored, refused, timed out,
its connection closed, replaced by new metadata; ``release``). It counts like an attached v3 upload:
toward its user's ``max_uploads_per_user`` and ``user_quota_bytes``, and toward the server's
``max_uploads`` (``held``); it is never chosen to be dropped, since it lives only as long as its
connection, and it has no file in the partial-upload directory (so ``forget`` never drops it either).

Pure bookkeeping: no file, no task. ``knowledge_uploads.UploadService`` owns one, tells it what it
finds on disk and what happens to each upload, and passes the ids in use where they matter.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from protocol import ErrorCode
from server.errors import HandlerError


@dataclass(slots=True)
class Partial:
    """A partial upload on this node's disk, as the limits see it."""
    user: str
    size: int                                  # declared: reserved against the quota at BEGIN
    at: float                                  # last touched (the oldest detached one is dropped first)
    seq: int = 0                               # (ties)
    held: bool = False                         # a v2 upload on a live connection (``hold``): never dropped


class UploadLedger:
    """upload_id -> ``Partial`` for every partial upload on disk; one per ``UploadService``."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._partials: dict[str, Partial] = {}
        self._seq = 0

    def found(self, partials: dict[str, Partial]) -> None:
        """The partial uploads found on disk at start (those already known are kept as they are)."""
        for uid, p in partials.items():
            self._partials.setdefault(uid, p)

    def reserved(self, user: str) -> tuple[int, int]:
        """(count, declared bytes) of ``user``'s partial uploads, attached or not."""
        mine = [p.size for p in self._partials.values() if p.user == user]
        return len(mine), sum(mine)

    def reserve(self, uid: str, user: str, size: int) -> Partial | None:
        """A BEGIN of ``uid`` (new or resumed) counts, touched now; what it was before (for ``restore``)."""
        before = self._partials.get(uid)
        self._seq += 1
        self._partials[uid] = Partial(user, size, self._clock(), self._seq)
        return before

    def restore(self, uid: str, before: Partial | None) -> None:
        """A BEGIN failed: a resumed upload counts as the detached one it was, a new one not at all."""
        if before is not None:
            self._partials[uid] = before
        else:
            self._partials.pop(uid, None)

    def hold(self, uid: str, user: str, size: int) -> None:
        """A v2 upload ``uid`` of ``size`` declared bytes counts from now on, until ``release``."""
        self._seq += 1
        self._partials[uid] = Partial(user, size, self._clock(), self._seq, held=True)

    def held(self, user: str | None = None) -> int:
        """How many v2 uploads (of ``user``, or of everyone) are held: they count toward ``max_uploads``
        like the v3 uploads attached to a connection."""
        return sum(1 for p in self._partials.values() if p.held and (user is None or p.user == user))

    def touch(self, uid: str) -> None:
        """``uid`` was detached: it is now the most recently touched (the last one dropped)."""
        p = self._partials.get(uid)
        if p is not None:
            self._seq += 1
            p.at, p.seq = self._clock(), self._seq

    def release(self, uid: str) -> None:
        """``uid`` no longer counts (ended, dropped, removed)."""
        self._partials.pop(uid, None)

    def forget(self, uids: Iterable[str], in_use: Collection[str]) -> None:
        """Partial uploads whose files expired no longer count, unless in use."""
        for uid in uids:
            p = self._partials.get(uid)
            if uid not in in_use and p is not None and not p.held:
                del self._partials[uid]

    def make_room(self, user: str, uid: str, size: int, used: int, in_use: Collection[str],
                  max_uploads_per_user: int, user_quota_bytes: int) -> list[str]:
        """The detached partial uploads of ``user`` to drop (least recently touched first; never one
        ``in_use``, never a held v2 upload) so that ``uid`` of ``size`` bytes fits ``max_uploads_per_user`` and
        ``user_quota_bytes`` next to ``used`` bytes of documents; QUOTA_EXCEEDED (nothing chosen) when
        even dropping all of them is not enough. The ledger is not changed (see ``release``)."""
        mine = {u: p for u, p in self._partials.items() if p.user == user and u != uid}
        count, nbytes = len(mine), sum(p.size for p in mine.values())
        droppable = sorted((u for u in mine if u not in in_use and not mine[u].held),
                           key=lambda u: (mine[u].at, mine[u].seq))
        victims: list[str] = []

        def fits() -> bool:
            return count < max_uploads_per_user and used + nbytes + size <= user_quota_bytes

        for u in droppable:
            if fits():
                break
            victims.append(u)
            count, nbytes = count - 1, nbytes - mine[u].size
        if count >= max_uploads_per_user:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED,
                               f"{count} uploads already in progress (max_uploads_per_user = "
                               f"{max_uploads_per_user}), on live connections or being stored; end one "
                               "(KB_UPLOAD_END, or a v2 upload's last FILE_DATA) or close its connection, then retry")
        if used + nbytes + size > user_quota_bytes:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED,
                               f"quota of {user_quota_bytes} bytes would be exceeded ({used} used by documents, "
                               f"{nbytes} reserved by {count} uploads in progress on live connections or being "
                               "stored, "
                               f"{size} asked; user_quota_bytes)")
        return victims

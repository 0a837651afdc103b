"""UploadLedger: what a user's partial uploads reserve, and which detached ones make room (pure)."""
from __future__ import annotations

import pytest

from server.errors import HandlerError
from server.handlers.upload_ledger import UploadLedger


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def test_the_least_recently_touched_detached_partials_make_room_and_live_ones_never_do():
    ledger = UploadLedger(Clock())
    for uid, size in (("a", 10), ("b", 20), ("c", 30)):
        ledger.reserve(uid, "alice", size)
    ledger.reserve("x", "bob", 500)                          # another user's: never counted for alice
    ledger.touch("a")                                        # detached last: dropped last
    assert ledger.reserved("alice") == (3, 60)
    # a 4th upload of 15 bytes: count limit 3 and quota 80 (with 5 bytes of documents)
    assert ledger.make_room("alice", "d", 15, 5, in_use={"c"}, max_uploads_per_user=3, user_quota_bytes=80) == ["b"]
    assert ledger.reserved("alice") == (3, 60)               # choosing changes nothing
    with pytest.raises(HandlerError) as err:                 # live ones alone are too large
        ledger.make_room("alice", "d", 60, 5, in_use={"a", "b", "c"}, max_uploads_per_user=9, user_quota_bytes=80)
    assert err.value.code == "QUOTA_EXCEEDED" and "quota of 80 bytes" in err.value.message


def test_a_failed_begin_restores_what_the_upload_was():
    ledger = UploadLedger(Clock())
    assert ledger.reserve("a", "alice", 10) is None
    before = ledger.reserve("a", "alice", 10)                # resumed
    ledger.restore("a", before)                              # that BEGIN failed: still the detached one
    assert ledger.reserved("alice") == (1, 10)
    ledger.restore("n", ledger.reserve("n", "alice", 7))     # a new one that failed: not counted at all
    assert ledger.reserved("alice") == (1, 10)
    ledger.forget(["a"], in_use={"a"})                       # expired files of an upload in use still count
    assert ledger.reserved("alice") == (1, 10)
    ledger.forget(["a"], in_use=set())
    assert ledger.reserved("alice") == (0, 0)

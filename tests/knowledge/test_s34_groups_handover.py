"""A group document handed over on its uploader's delete (review s34, groups findings 1 and 4).

- The uploader's delete passes a group document only to a co-uploader who can still read the
  collection: before, it went to the first co-uploader even when they had left the group, and the
  document stayed in the group, readable by every member, deletable by nobody there (alice:
  FORBIDDEN) nor by an admin outside it (NOT_FOUND). With nobody left who can take it, it is removed.
- A co-uploader who has left the group may still withdraw their co-upload (before: NOT_FOUND).
- The document passes only to a co-uploader with room for it within their own limits (before: bob
  went to 23,065 bytes of a 20,000-byte quota, and his next 2-byte upload was refused); the first in
  order who fits takes it, and with none it is removed.

In process (``KnowledgeBase`` with ``groups_of``) and over real TCP against a server restarted on a
new ``[auth]`` configuration.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from protocol import ErrorCode, MsgType
from server.auth import hash_token
from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from kb_wire.kbwire import raw_upload
from testkit.server import ReplyError, V3Client, running_server

HANDOVER = b"# Handover\n\nThe on-call handover happens at 09:00 in the ops channel; the pager moves then.\n"


def _config(**kw) -> KnowledgeConfig:
    return KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40, **kw)


async def _started(root, groups: dict[str, list[str]], **kw) -> KnowledgeBase:
    kb = KnowledgeBase(_config(**kw), root, groups_of=lambda u: groups.get(u, ()))
    await kb.start()
    return kb


# -- in process ------------------------------------------------------------------------------------
async def test_the_uploaders_delete_skips_a_co_uploader_who_left_and_removes_the_document(tmp_path):
    groups = {"alice": ["ops"], "bob": ["ops"]}
    kb = await _started(tmp_path / "kb", groups)
    try:
        a = await kb.ingest("alice", groups["alice"], "group:ops", "handover.md", HANDOVER)
        await kb.ingest("bob", groups["bob"], "group:ops", "handover.md", HANDOVER)
        assert kb.co_uploaders(a.doc_id) == ("bob",)
        groups["bob"] = []                                           # bob leaves ops
        passed: list[tuple[str, str]] = []
        kept = await kb.delete("alice", groups["alice"], a.doc_id, passed_over=passed)
        assert kept is None                                          # before: kept for bob
        assert passed == [("bob", "no longer in group:ops")]
        assert await kb.list("alice", ["ops"]) == [] and await kb.list("bob", []) == []
        assert kb.usage("bob") == 0
    finally:
        await kb.close()


async def test_the_document_passes_to_the_next_co_uploader_who_is_still_a_member(tmp_path):
    groups = {"alice": ["ops"], "bob": ["ops"], "carol": ["ops"]}
    kb = await _started(tmp_path / "kb", groups)
    try:
        a = await kb.ingest("alice", ["ops"], "group:ops", "handover.md", HANDOVER)
        await kb.ingest("bob", ["ops"], "group:ops", "b.md", HANDOVER)
        await kb.ingest("carol", ["ops"], "group:ops", "c.md", HANDOVER)
        groups["bob"] = ["dev"]
        kept = await kb.delete("alice", ["ops"], a.doc_id)
        assert kept is not None and kept.uploader == "carol"          # before: bob
        assert kb.co_uploaders(a.doc_id) == ("bob",)                  # (bob's co-upload stays his to withdraw)
        assert kb.usage("carol") == a.size and kb.usage("bob") == 0
        # carol, a member, deletes it as its uploader; bob (left) is passed over: removed
        assert await kb.delete("carol", ["ops"], a.doc_id) is None
    finally:
        await kb.close()


async def test_a_co_uploader_who_left_withdraws_their_co_upload(tmp_path):
    groups = {"alice": ["ops"], "bob": ["ops"]}
    kb = await _started(tmp_path / "kb", groups)
    try:
        a = await kb.ingest("alice", ["ops"], "group:ops", "handover.md", HANDOVER)
        await kb.ingest("bob", ["ops"], "group:ops", "handover.md", HANDOVER)
        groups["bob"] = []
        [listed] = await kb.list("bob", [])                          # his co-upload, to find it by
        assert listed.doc_id == a.doc_id
        kept = await kb.delete("bob", [], a.doc_id)                  # before: NOT_FOUND
        assert kept is not None and kept.uploader == "alice" and kb.co_uploaders(a.doc_id) == ()
        assert await kb.list("bob", []) == []
        with pytest.raises(HandlerError) as exc:                      # still closed to him
            await kb.get("bob", [], a.doc_id)
        assert exc.value.code == ErrorCode.NOT_FOUND
    finally:
        await kb.close()


async def test_an_admin_who_left_withdraws_their_co_upload_and_removes_nothing(tmp_path):
    groups = {"alice": ["ops"], "root": ["ops"]}
    kb = await _started(tmp_path / "kb", groups)
    try:
        a = await kb.ingest("alice", ["ops"], "group:ops", "handover.md", HANDOVER)
        await kb.ingest("root", ["ops"], "group:ops", "handover.md", HANDOVER)
        groups["root"] = []
        kept = await kb.delete("root", [], a.doc_id, admin=True)     # before: NOT_FOUND
        assert kept is not None and kept.uploader == "alice" and kb.co_uploaders(a.doc_id) == ()
        assert [d.doc_id for d in await kb.list("alice", ["ops"])] == [a.doc_id]
    finally:
        await kb.close()


async def test_the_document_passes_only_to_a_co_uploader_with_room_in_their_quota(tmp_path):
    groups = {"alice": ["ops"], "bob": ["ops"], "carol": ["ops"]}
    quota = 2_000
    kb = await _started(tmp_path / "kb", groups, user_quota_bytes=quota)
    try:
        big = HANDOVER + b"\n" + b"The pager rota is in the ops wiki; swaps are announced a day ahead.\n" * 12
        a = await kb.ingest("alice", ["ops"], "group:ops", "handover.md", big)
        await kb.ingest("bob", ["ops"], "group:ops", "h.md", big)
        await kb.ingest("carol", ["ops"], "group:ops", "h.md", big)
        own = await kb.ingest("bob", ["ops"], None, "mine.txt", b"bob's own notes on the staging proxy\n" * 30)
        assert kb.usage("bob") + a.size > quota >= a.size              # bob has no room for it, carol has
        passed: list[tuple[str, str]] = []
        kept = await kb.delete("alice", ["ops"], a.doc_id, passed_over=passed)
        assert kept is not None and kept.uploader == "carol"          # before: bob, over his quota
        assert kb.usage("bob") == own.size <= quota
        [(who, why)] = passed
        assert who == "bob" and why.startswith(f"no room: quota of {quota} bytes reached")
        # bob has room for a small upload still
        await kb.ingest("bob", ["ops"], None, "small.txt", b"ok\n")
        # carol's delete: bob still has no room, nobody else: removed
        assert await kb.delete("carol", ["ops"], a.doc_id) is None
        assert [d.doc_id for d in await kb.list("alice", ["ops"]) if d.collection == "group:ops"] == []
    finally:
        await kb.close()


async def test_a_hand_over_respects_the_chunk_and_member_shares_too(tmp_path):
    groups = {"alice": ["ops"], "bob": ["ops"]}
    kb = await _started(tmp_path / "kb", groups, max_documents_per_member=1)
    try:
        a = await kb.ingest("alice", ["ops"], "group:ops", "handover.md", HANDOVER)
        await kb.ingest("bob", ["ops"], "group:ops", "h.md", HANDOVER)
        await kb.ingest("bob", ["ops"], "group:ops", "other.md", b"# Other\n\nbob's one document of ops.\n")
        passed: list[tuple[str, str]] = []
        assert await kb.delete("alice", ["ops"], a.doc_id, passed_over=passed) is None
        assert passed[0][0] == "bob" and "max_documents_per_member = 1" in passed[0][1]
    finally:
        await kb.close()


# -- over TCP, the server restarted on a new [auth] ------------------------------------------------
def _sections(bob_groups: list[str], quota: int = 20_000) -> dict:
    users = {"alice": (["ops"], False), "bob": (bob_groups, False), "carol": (["ops"], False),
             "root": ([], True)}
    return {"auth": {"users": [{"user_id": u, "token_sha256": hash_token(f"token-{u}"), "groups": g, "admin": a}
                               for u, (g, a) in users.items()]},
            "knowledge": {"user_quota_bytes": quota}}


async def _connect(addr, user: str) -> V3Client:
    return await V3Client.connect(addr, token=f"token-{user}")


def _membership(srv) -> None:
    """The server's knowledge base asks ``[auth]`` for a co-uploader's groups. (This is what
    ``server.services.build_services`` is to pass: ``KnowledgeBase(..., groups_of=auth.groups_of)``.)"""
    assert srv.services.knowledge.groups_of == srv.services.auth.groups_of


async def _code(c: V3Client, msg_type: int, **body) -> str:
    with pytest.raises(ReplyError) as exc:
        await c.call(msg_type, **body)
    return exc.value.code


async def test_over_tcp_a_document_is_not_handed_to_a_co_uploader_who_left(tmp_path: Path):
    async with running_server(tmp_path, sections=_sections(["ops"])) as (srv, addr):
        alice, bob = await _connect(addr, "alice"), await _connect(addr, "bob")
        doc = (await raw_upload(alice, "handover.md", HANDOVER, collection="ops"))["document"]
        dup = (await raw_upload(bob, "handover.md", HANDOVER, collection="ops"))["document"]
        assert dup["duplicate"] and dup["doc_id"] == doc["doc_id"]
        await alice.close(), await bob.close()
    async with running_server(tmp_path, sections=_sections([])) as (srv, addr):     # bob has left ops
        _membership(srv)
        alice, carol, root = await _connect(addr, "alice"), await _connect(addr, "carol"), await _connect(addr, "root")
        reply = await alice.call(MsgType.KB_DELETE, doc_id=doc["doc_id"])
        assert reply["deleted"] is True and "kept_for" not in reply             # before: kept_for bob
        assert (await carol.call(MsgType.KB_LIST, collection="ops"))["documents"] == []
        assert await _code(alice, MsgType.KB_DELETE, doc_id=doc["doc_id"]) == "NOT_FOUND"   # before: FORBIDDEN
        bob = await _connect(addr, "bob")
        assert (await bob.call(MsgType.KB_LIST))["documents"] == []
        await alice.close(), await carol.close(), await root.close(), await bob.close()


async def test_over_tcp_a_co_uploader_who_left_withdraws_and_the_uploader_then_removes_it(tmp_path: Path):
    async with running_server(tmp_path, sections=_sections(["ops"])) as (srv, addr):
        alice, bob = await _connect(addr, "alice"), await _connect(addr, "bob")
        doc = (await raw_upload(alice, "handover.md", HANDOVER, collection="ops"))["document"]
        await raw_upload(bob, "handover.md", HANDOVER, collection="ops")
        await alice.close(), await bob.close()
    async with running_server(tmp_path, sections=_sections([])) as (srv, addr):
        _membership(srv)
        bob, alice = await _connect(addr, "bob"), await _connect(addr, "alice")
        [listed] = (await bob.call(MsgType.KB_LIST))["documents"]                 # his co-upload is listed
        assert listed["doc_id"] == doc["doc_id"]
        reply = await bob.call(MsgType.KB_DELETE, doc_id=doc["doc_id"])          # before: NOT_FOUND
        assert reply["deleted"] is True and reply["kept_for"] == "alice"
        assert (await bob.call(MsgType.KB_LIST))["documents"] == []
        assert await _code(bob, MsgType.KB_PASSAGE, chunk_id=f"{doc['doc_id']}:0") == "NOT_FOUND"
        reply = await alice.call(MsgType.KB_DELETE, doc_id=doc["doc_id"])
        assert reply["deleted"] is True and "kept_for" not in reply
        await alice.close(), await bob.close()


async def test_over_tcp_the_document_goes_to_the_co_uploader_with_room(tmp_path: Path):
    quota = 20_000
    big = b"ops handover: page the secondary when the primary does not answer in 5 minutes\n" * 200   # 16,000 bytes
    async with running_server(tmp_path, sections=_sections(["ops"], quota)) as (srv, addr):
        _membership(srv)
        alice, bob, carol = await _connect(addr, "alice"), await _connect(addr, "bob"), await _connect(addr, "carol")
        doc = (await raw_upload(alice, "handover.txt", big, collection="ops"))["document"]
        await raw_upload(bob, "handover.txt", big, collection="ops")
        await raw_upload(carol, "handover.txt", big, collection="ops")
        await raw_upload(bob, "own.txt", b"bob's notes on the proxy\n" * 280)       # 7,000 bytes: no room for 16,000
        reply = await alice.call(MsgType.KB_DELETE, doc_id=doc["doc_id"])
        assert reply["kept_for"] == "carol"                                       # before: bob (23,000 of 20,000)
        await raw_upload(bob, "two.txt", b"ok")                                   # before: QUOTA_EXCEEDED
        [kept] = (await carol.call(MsgType.KB_LIST, collection="ops"))["documents"]
        assert (kept["doc_id"], kept["uploader"]) == (doc["doc_id"], "carol")
        await alice.close(), await bob.close(), await carol.close()

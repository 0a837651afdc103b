"""Per-user shares of the server-wide knowledge limits, reserved group names, many groups (review
s34, groups findings 2, 3, 5 and 7).

- ``max_chunks_per_user``: one user's uploads cannot fill ``max_total_chunks`` for everyone (before,
  with ``max_total_chunks = 40``, dave's 36 chunks made alice's 10-chunk upload QUOTA_EXCEEDED).
- ``max_documents_per_member``: one member cannot fill a group's ``max_documents_per_collection``
  (before, bob's 5 tiny documents with a limit of 5 locked alice out of the group).
- a group named ``personal`` (any case) is refused at start-up: ``--group personal`` resolved to the
  caller's own collection, so such a group could never be chosen.
- a search walks only the collections that hold chunks (before, one BM25 search per readable
  collection, empty ones included, under the knowledge base's lock: alice in 20,002 groups took
  0.7-1.6 s a search, and every other user's search waited); ``[auth] max_groups_per_user``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from server.auth import hash_token
from server.config import ServerConfig
from server.config_base import ConfigError
from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from kb_wire.kbwire import raw_upload
from testkit.server import ReplyError, V3Client, running_server


def _chunky(n: int, tag: str) -> bytes:
    """A markdown document of ``n`` chunks (one section each) at chunk_target_chars = 200."""
    return "".join(f"# {tag} section {i}\n\nThe {tag} runbook step {i}: check the queue depth and "
                   f"the replica lag before step {i + 1}.\n\n" for i in range(n)).encode()


def _sections(knowledge: dict, groups: dict[str, list[str]] | None = None) -> dict:
    groups = groups or {"alice": ["ops"], "bob": ["ops"], "dave": []}
    return {"auth": {"users": [{"user_id": u, "token_sha256": hash_token(f"token-{u}"), "groups": g}
                               for u, g in groups.items()]},
            "knowledge": {"chunk_target_chars": 200, "chunk_overlap_chars": 40, **knowledge}}


async def _connect(addr, user: str) -> V3Client:
    return await V3Client.connect(addr, token=f"token-{user}")


# -- max_chunks_per_user ---------------------------------------------------------------------------
def test_the_per_user_chunk_limit_defaults_to_a_tenth_of_the_default_total():
    cfg = KnowledgeConfig()
    assert cfg.max_chunks_per_user == 100_000 == cfg.max_total_chunks // 10


async def test_over_tcp_one_user_cannot_take_every_chunk_of_the_server(tmp_path: Path):
    knowledge = {"max_total_chunks": 40, "max_chunks_per_user": 20}
    async with running_server(tmp_path, sections=_sections(knowledge)) as (_srv, addr):
        dave, alice = await _connect(addr, "dave"), await _connect(addr, "alice")
        first = (await raw_upload(dave, "first.md", _chunky(12, "dave")))["document"]
        assert first["chunks"] == 12
        with pytest.raises(ReplyError) as exc:                       # 12 + 12 > 20
            await raw_upload(dave, "second.md", _chunky(12, "more"))
        assert exc.value.code == "QUOTA_EXCEEDED"
        assert exc.value.body["message"] == ("your documents hold 12 chunks; this document's 12 would take you over "
                                     "the per-user limit (max_chunks_per_user = 20)")
        # a group upload counts too
        grouped = (await raw_upload(alice, "a.md", _chunky(12, "alice"), collection="ops"))["document"]
        assert grouped["chunks"] == 12
        with pytest.raises(ReplyError) as exc:
            await raw_upload(alice, "b.md", _chunky(12, "other"), collection="ops")
        assert exc.value.body["message"] == ("your documents hold 12 chunks; this document's 12 would take you over "
                                             "the per-user limit (max_chunks_per_user = 20)")
        bob = await _connect(addr, "bob")
        doc = (await raw_upload(bob, "b.md", _chunky(10, "bob")))["document"]   # before: over max_total_chunks
        assert doc["chunks"] == 10
        await dave.close(), await alice.close(), await bob.close()


async def test_the_chunks_being_committed_count_toward_the_user(tmp_path):
    kb = KnowledgeBase(KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40, max_chunks_per_user=5),
                       tmp_path / "kb")
    await kb.start()
    try:
        kb._committing["x" * 24] = ("dave", 4)                        # another of dave's ingests, committing
        with pytest.raises(HandlerError) as exc:
            await kb.ingest("dave", [], None, "two.md", _chunky(2, "dave"))
        assert "max_chunks_per_user = 5" in str(exc.value) and "hold 4 chunks" in str(exc.value)
        kb._committing.clear()
        assert (await kb.ingest("dave", [], None, "two.md", _chunky(2, "dave"))).chunks == 2
    finally:
        await kb.close()


# -- max_documents_per_member ----------------------------------------------------------------------
def test_the_member_share_defaults_to_a_quarter_of_the_collection():
    assert KnowledgeConfig().documents_per_member == 2_500
    assert KnowledgeConfig(max_documents_per_collection=5).documents_per_member == 1
    assert KnowledgeConfig(max_documents_per_collection=5, max_documents_per_member=3).documents_per_member == 3


async def test_over_tcp_one_member_cannot_fill_the_groups_collection(tmp_path: Path):
    knowledge = {"max_documents_per_collection": 5, "max_documents_per_member": 3}
    async with running_server(tmp_path, sections=_sections(knowledge)) as (_srv, addr):
        bob, alice = await _connect(addr, "bob"), await _connect(addr, "alice")
        for i in range(3):
            await raw_upload(bob, f"b{i}.txt", f"bob's note {i}\n".encode(), collection="ops")
        with pytest.raises(ReplyError) as exc:
            await raw_upload(bob, "b3.txt", b"bob's note 3\n", collection="ops")
        assert exc.value.code == "QUOTA_EXCEEDED"
        assert exc.value.body["message"] == ("you uploaded 3 of the 3 documents of group:ops, a member's share "
                                     "(max_documents_per_member = 3): delete one of yours first")
        for i in range(2):                                           # before: "collection holds 5 documents"
            await raw_upload(alice, f"a{i}.txt", f"alice's note {i}\n".encode(), collection="ops")
        with pytest.raises(ReplyError) as exc:                       # the collection's own limit, counted
            await raw_upload(alice, "a2.txt", b"alice's note 2\n", collection="ops")
        assert exc.value.body["message"] == ("collection group:ops holds 5 documents (max_documents_per_collection = 5), "
                                     "2 of them yours")
        for i in range(5):                                           # a personal collection has no member share
            await raw_upload(bob, f"p{i}.txt", f"bob's own {i}\n".encode())
        await bob.close(), await alice.close()


# -- reserved group names --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["personal", "Personal", "PERSONAL"])
def test_a_group_named_personal_is_refused_at_start_up(name: str, tmp_path):
    d = {"storage": {"root": str(tmp_path)},
         "auth": {"users": [{"user_id": "alice", "token_sha256": "a" * 64, "groups": ["ops", name]}]}}
    with pytest.raises(ConfigError) as exc:
        ServerConfig.from_dict(d, env={})
    assert exc.value.path == "auth.users[0].groups"
    assert f"{name!r} cannot name a group: 'personal' is reserved" in exc.value.message


def test_group_names_that_merely_contain_personal_are_kept(tmp_path):
    d = {"storage": {"root": str(tmp_path)},
         "auth": {"users": [{"user_id": "alice", "token_sha256": "a" * 64, "groups": ["personal-ops", "mypersonal"]}]}}
    assert ServerConfig.from_dict(d, env={}).auth.users[0].groups == ("personal-ops", "mypersonal")


# -- many groups -----------------------------------------------------------------------------------
def test_too_many_groups_for_one_user_are_refused_at_start_up(tmp_path):
    users = [{"user_id": "alice", "token_sha256": "a" * 64, "groups": [f"g{i}" for i in range(1_001)]}]
    with pytest.raises(ConfigError) as exc:
        ServerConfig.from_dict({"storage": {"root": str(tmp_path)}, "auth": {"users": users}}, env={})
    assert exc.value.path == "auth.users[0].groups"
    assert exc.value.message == ("user 'alice' is in 1001 groups, over max_groups_per_user = 1000 "
                                 "(raise it in [auth] if that many are meant)")
    cfg = ServerConfig.from_dict({"storage": {"root": str(tmp_path)},
                                  "auth": {"users": users, "max_groups_per_user": 2_000}}, env={})
    assert len(cfg.auth.users[0].groups) == 1_001


async def test_a_search_walks_only_the_collections_that_hold_chunks(tmp_path, monkeypatch):
    kb = KnowledgeBase(KnowledgeConfig(chunk_target_chars=200, chunk_overlap_chars=40), tmp_path / "kb")
    await kb.start()
    try:
        groups = ["ops", "dev"] + [f"g{i}" for i in range(3_000)]
        await kb.ingest("alice", groups, "group:ops", "rot.md", b"# Rotation\n\nThe key rotation zone runs nightly.\n")
        await kb.ingest("alice", groups, "group:g7", "rot7.md", b"# Zone\n\nrotation of the key zone in g7.\n")
        searched: list = []
        real = kb.index.bm25.search

        def counting(*a, **kw):
            searched.append(kw.get("group"))
            return real(*a, **kw)
        monkeypatch.setattr(kb.index.bm25, "search", counting)
        hits = await kb.search("alice", groups, "rotation key zone", 5)
        assert {h.collection for h in hits} == {"group:ops", "group:g7"}
        assert sorted(searched) == ["group:g7", "group:ops"]            # before: 3,003 searches
        # the same scores as a user in only those groups (the empty ones add no statistics)
        few = await kb.search("alice", ["ops", "g7"], "rotation key zone", 5)
        assert [(h.chunk_id, h.score) for h in few] == [(h.chunk_id, h.score) for h in hits]
        # and after the last document of a collection goes, it is skipped again
        [g7] = [d for d in await kb.list("alice", groups) if d.collection == "group:g7"]
        await kb.delete("alice", groups, g7.doc_id)
        searched.clear()
        await kb.search("alice", groups, "rotation key zone", 5)
        assert searched == ["group:ops"]
    finally:
        await kb.close()

"""Documents a user uploaded into a group they then left (or a group renamed or removed from the
configuration) stay on their quota: they see them in their list and may delete them, while the
group's content stays closed to them. Before, the list was empty and every delete NOT_FOUND, so
the uploader's quota stayed taken for good.

Over real TCP, with a server restarted on a new ``[auth]`` configuration.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from protocol import MsgType
from server.auth import hash_token
from server.errors import HandlerError
from kb_wire.kbwire import raw_upload
from testkit.server import ReplyError, V3Client, running_server

QUOTA = 20_000
GROUP_DOC = b"ops runbook: restart the ingest queue with qctl drain\n" * 280      # 15,120 bytes
OWN_DOC = b"my own notes about the staging proxy\n" * 250                          # 9,250 bytes


def sections(bob_groups: list[str]) -> dict:
    users = {"alice": (["ops"], False), "bob": (bob_groups, False), "root": ([], True)}
    return {"auth": {"users": [{"user_id": u, "token_sha256": hash_token(f"token-{u}"), "groups": g, "admin": a}
                               for u, (g, a) in users.items()]},
            "knowledge": {"user_quota_bytes": QUOTA}}


async def connect(addr, user: str) -> V3Client:
    return await V3Client.connect(addr, token=f"token-{user}")


async def upload(c: V3Client, name: str, data: bytes, collection: str | None = None) -> dict:
    return (await raw_upload(c, name, data, collection=collection))["document"]


async def code_of(c: V3Client, msg_type: int, **body) -> str:
    with pytest.raises(ReplyError) as exc:
        await c.call(msg_type, **body)
    return exc.value.code


@pytest.mark.parametrize("bob_groups_after", [[], ["ops-renamed"]])
async def test_uploader_who_left_the_group_lists_and_deletes_their_upload(tmp_path: Path, bob_groups_after):
    async with running_server(tmp_path, sections=sections(["ops"])) as (srv, addr):
        bob = await connect(addr, "bob")
        doc = await upload(bob, "ops.txt", GROUP_DOC, collection="ops")
        assert doc["collection"] == "group:ops" and doc["uploader"] == "bob"
        await bob.close()
    # restarted: bob is no longer in ops (removed from the group, or the group renamed)
    async with running_server(tmp_path, sections=sections(bob_groups_after)) as (srv, addr):
        bob, alice, root = await connect(addr, "bob"), await connect(addr, "alice"), await connect(addr, "root")
        doc_id = doc["doc_id"]
        # over the quota with the group's document: refused, and the list says what takes the room
        with pytest.raises(ReplyError) as exc:
            await upload(bob, "mine.txt", OWN_DOC)
        assert exc.value.code == "QUOTA_EXCEEDED"
        listed = (await bob.call(MsgType.KB_LIST))["documents"]
        assert [(d["doc_id"], d["collection"], d["size"]) for d in listed] == [(doc_id, "group:ops", len(GROUP_DOC))]
        # the group's content stays closed to him
        assert await code_of(bob, MsgType.KB_LIST, collection="group:ops") == "FORBIDDEN"
        assert await code_of(bob, MsgType.KB_PASSAGE, chunk_id=f"{doc_id}:0") == "NOT_FOUND"
        assert await code_of(bob, MsgType.KB_DOWNLOAD, doc_id=doc_id, handle=1) == "NOT_FOUND"
        assert (await bob.call(MsgType.KB_SEARCH, query="restart the ingest queue", limit=10))["hits"] == []
        # alice (still in ops) reads it but may not delete it (not hers); the admin outside ops sees nothing
        assert (await alice.call(MsgType.KB_SEARCH, query="qctl drain", limit=3))["hits"][0]["doc_id"] == doc_id
        assert await code_of(alice, MsgType.KB_DELETE, doc_id=doc_id) == "FORBIDDEN"
        assert await code_of(root, MsgType.KB_DELETE, doc_id=doc_id) == "NOT_FOUND"
        # bob deletes his upload: his quota is free again, and the group no longer has it
        assert (await bob.call(MsgType.KB_DELETE, doc_id=doc_id))["deleted"] is True
        assert (await alice.call(MsgType.KB_LIST))["documents"] == []
        mine = await upload(bob, "mine.txt", OWN_DOC)
        assert [d["doc_id"] for d in (await bob.call(MsgType.KB_LIST))["documents"]] == [mine["doc_id"]]
        for c in (bob, alice, root):
            await c.close()


async def test_in_process_only_the_uploader_reaches_a_document_outside_their_collections(kb):
    info = await kb.ingest("bob", ["ops"], "group:ops", "ops.txt", GROUP_DOC)
    # bob has left ops: listed (metadata of his own upload) but not readable
    assert [d.doc_id for d in await kb.list("bob", [])] == [info.doc_id]
    for call in (lambda: kb.get("bob", [], info.doc_id), lambda: kb.get_passage("bob", [], f"{info.doc_id}:0"),
                 lambda: kb.open_document("bob", [], info.doc_id), lambda: kb.list("bob", [], "group:ops")):
        with pytest.raises(HandlerError) as exc:
            await call()
        assert exc.value.code in ("NOT_FOUND", "FORBIDDEN")
    assert await kb.search("bob", [], "restart the ingest queue") == []
    from server.offers import OfferService          # a download asked by name finds only readable ones
    with pytest.raises(HandlerError) as exc:
        await OfferService(kb, None, None).find("bob", [], name="ops.txt")
    assert exc.value.code == "NOT_FOUND" and "different documents" not in exc.value.message
    # nobody else outside ops reaches it, admin or not; carol in ops reads it but may not delete it
    assert await kb.list("carol", []) == []
    for user, groups, admin, code in (("carol", [], False, "NOT_FOUND"), ("carol", [], True, "NOT_FOUND"),
                                      ("carol", ["ops"], False, "FORBIDDEN")):
        with pytest.raises(HandlerError) as exc:
            await kb.delete(user, groups, info.doc_id, admin=admin)
        assert exc.value.code == code
    assert kb.usage("bob") == len(GROUP_DOC)
    await kb.delete("bob", [], info.doc_id)
    assert kb.usage("bob") == 0 and await kb.list("carol", ["ops"]) == [] and len(kb.index) == 0

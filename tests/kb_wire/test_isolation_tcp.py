"""Isolation over real TCP: users and groups never list, search, get, download or delete a
document outside their collections. Every probe is counted; the test requires (and prints) 0 leaks."""
from __future__ import annotations

from protocol import MsgType
from protocol.binary import decode_data
from testkit.server import ReplyError

from kb_wire.kbwire import USERS, connect, kb_server, raw_upload

SECRET = "The vault code of {owner} in {coll} is {token}. vault code secret"


async def test_no_probe_over_tcp_reaches_a_foreign_document(tmp_path):
    async with kb_server(tmp_path) as (srv, addr):
        clients = {u: await connect(addr, u) for u in USERS}
        docs = []                                       # (document, token)
        for owner, coll in [("alice", None), ("bob", None), ("alice", "group:red"), ("bob", "blue"),
                            ("carol", "group:red"), ("carol", None), ("root", None)]:
            tok = f"tok{len(docs)}qq"
            text = SECRET.format(owner=owner, coll=coll, token=tok).encode()
            doc = (await raw_upload(clients[owner], f"{owner}-{len(docs)}.txt", text, collection=coll))["document"]
            docs.append((doc, tok))
        probes = leaks = 0
        for user, (groups, _admin) in USERS.items():
            c = clients[user]
            readable = {f"user:{user}"} | {f"group:{g}" for g in groups}
            listed = {d["doc_id"] for d in (await c.call(MsgType.KB_LIST))["documents"]}
            for doc, tok in docs:
                visible = doc["collection"] in readable
                probes += 1
                leaks += (doc["doc_id"] in listed) and not visible
                assert (doc["doc_id"] in listed) == visible
                hits = (await c.call(MsgType.KB_SEARCH, query=f"vault code {tok}", limit=100))["hits"]
                probes += 1
                leaks += (not visible) and any(h["doc_id"] == doc["doc_id"] or tok in h["text"] for h in hits)
                for msg_type, body in ((MsgType.KB_PASSAGE, {"chunk_id": f"{doc['doc_id']}:0"}),
                                       (MsgType.KB_DOWNLOAD, {"doc_id": doc["doc_id"], "handle": 1}),
                                       (MsgType.KB_LIST, {"collection": doc["collection"]}),
                                       (MsgType.KB_SEARCH, {"query": tok, "collection": doc["collection"]})):
                    probes += 1
                    try:
                        reply = await c.call(msg_type, **body)
                    except ReplyError as exc:
                        assert not visible, (user, msg_type, exc.body)
                        assert exc.code in ("NOT_FOUND", "FORBIDDEN")
                        continue
                    leaks += not visible
                    assert visible, (user, msg_type, reply)
                data = [m for m in c.inbox if m.type == MsgType.KB_DOWNLOAD_DATA]
                probes += 1
                leaks += (not visible) and any(tok.encode() in bytes(decode_data(m.body)[2]) for m in data)
                c.inbox.clear()
        # delete: only the uploader or an admin, and only what the caller can see
        for doc, _tok in docs:
            for user, (groups, admin) in USERS.items():
                if user == doc["uploader"]:
                    continue
                probes += 1
                try:
                    await clients[user].call(MsgType.KB_DELETE, doc_id=doc["doc_id"])
                except ReplyError as exc:
                    visible = doc["collection"] in {f"user:{user}"} | {f"group:{g}" for g in groups}
                    assert exc.code == ("FORBIDDEN" if visible else "NOT_FOUND")
                    continue
                leaks += 1
        print(f"isolation over TCP: {probes} probes, {leaks} leaks")
        assert leaks == 0 and probes == 273
        # the uploader deletes their own; an admin deletes what it can see
        await clients["alice"].call(MsgType.KB_DELETE, doc_id=docs[0][0]["doc_id"])
        root_doc = docs[-1][0]
        assert (await clients["root"].call(MsgType.KB_DELETE, doc_id=root_doc["doc_id"]))["deleted"] is True
        for c in clients.values():
            await c.close()


async def test_admin_deletes_a_group_document_it_did_not_upload(tmp_path):
    from kb_wire import kbwire
    kbwire.USERS["erin"] = (["red"], True)
    try:
        async with kb_server(tmp_path) as (srv, addr):
            alice, erin = await connect(addr, "alice"), await connect(addr, "erin")
            doc = (await raw_upload(alice, "shared.txt", b"red team notes", collection="red"))["document"]
            assert (await erin.call(MsgType.KB_DELETE, doc_id=doc["doc_id"]))["deleted"] is True
            assert (await alice.call(MsgType.KB_LIST))["documents"] == []
            await alice.close()
            await erin.close()
    finally:
        del kbwire.USERS["erin"]

"""Users and groups are isolated: every probe of a foreign document (list, search, get, passage,
download, delete) is counted; the test reports and requires 0 leaks."""
from __future__ import annotations

import pytest

from server.errors import HandlerError

# (user, groups) principals; collections: alice's and bob's personal ones, group red, group blue
PRINCIPALS = {"alice": ["red"], "bob": ["blue"], "carol": ["red", "blue"], "dave": []}
SECRET = "The vault combination for {owner} in {coll} is {token}."


async def test_no_probe_reaches_a_document_outside_the_callers_collections(kb):
    docs = []                                              # (info, token)
    for owner, coll in [("alice", None), ("bob", None), ("alice", "group:red"), ("bob", "group:blue"),
                        ("carol", "group:red"), ("carol", None)]:
        token = f"tok{len(docs)}zz"
        text = SECRET.format(owner=owner, coll=coll, token=token) + " vault combination secret"
        info = await kb.ingest(owner, PRINCIPALS[owner], coll, f"{owner}-{len(docs)}.txt", text.encode())
        docs.append((info, token))
    probes = leaks = 0
    for user, groups in PRINCIPALS.items():
        readable = {f"user:{user}"} | {f"group:{g}" for g in groups}
        listed = {d.doc_id for d in await kb.list(user, groups)}
        for info, token in docs:
            visible = info.collection in readable
            probes += 1
            leaks += (info.doc_id in listed) != visible and not visible
            assert (info.doc_id in listed) == visible
            hits = await kb.search(user, groups, f"vault combination {token}", 50)
            probes += 1
            leaks += (not visible) and any(h.doc_id == info.doc_id or token in h.text for h in hits)
            for call in (lambda: kb.get(user, groups, info.doc_id),
                         lambda: kb.get_passage(user, groups, f"{info.doc_id}:0"),
                         lambda: kb.open_document(user, groups, info.doc_id),
                         lambda: kb.list(user, groups, info.collection),
                         lambda: kb.search(user, groups, token, 5, collection=info.collection)):
                probes += 1
                try:
                    result = await call()
                except HandlerError as exc:
                    assert exc.code in ("NOT_FOUND", "FORBIDDEN")
                    assert visible is False or exc.code != "NOT_FOUND", (user, info)
                    continue
                if isinstance(result, tuple):
                    result[1].close()
                leaks += not visible
            if not visible:                                # deleting a foreign document: not found
                probes += 1
                try:
                    await kb.delete(user, groups, info.doc_id, admin=False)
                    leaks += 1
                except HandlerError as exc:
                    assert exc.code == "NOT_FOUND"
    print(f"isolation: {probes} probes, {leaks} leaks")
    assert probes >= 4 * 6 * 7 and leaks == 0
    assert len(await kb.list("carol", ["red", "blue"])) == 4      # red x2, blue, her own; no personal of others


@pytest.mark.parametrize("name", ["group:red", "red", "user:bob", "group:", "*", "group:red/../blue"])
async def test_naming_a_collection_one_is_not_in_is_forbidden(kb, name):
    if name == "red":
        assert (await kb.ingest("alice", ["red"], name, "a.txt", b"hello")).collection == "group:red"
        return
    groups = [] if name == "group:red" else ["red"]
    with pytest.raises(HandlerError) as e:
        await kb.ingest("alice", groups, name, "a.txt", b"hello")
    assert e.value.code == "FORBIDDEN"
    with pytest.raises(HandlerError):
        await kb.search("alice", groups, "hello", 5, collection=name)

"""Search statistics are isolated too: the document count, document frequencies and average length
behind a user's scores (BM25 and the second stage's term weights) come only from the collections
the user reads, so another user's documents -- added, deleted, containing the query's terms or not
-- never change a result's ids, order or scores (they would tell whether a word is in them)."""
from __future__ import annotations

import pytest

from server.knowledge.index import ChunkIndex, chunk_terms

QUERY = "pineapple42 zzqv9 launch"
BOB = ["zzqv9 launch checklist for the spring release",
       "the zzqv9 notes: launch window, rollback plan and the launch owner",
       "unrelated text about backups and disks",
       "zzqv9 zzqv9 launch review with pineapple43 numbers"]
ALICE = ["customer pineapple42 contract: zzqv9 pricing",          # the query's terms, privately
         "pineapple42 pineapple42 launch plan " + "filler words " * 30,
         "nothing in common with the question at all"]


def chunks_of(texts: list[str], heading: str = "Notes") -> tuple[list[dict], list[dict[str, float]]]:
    chunks = [{"text": t, "location": {"heading": [heading]}} for t in texts]
    return chunks, [chunk_terms(c["text"], c["location"]["heading"], 1.0) for c in chunks]


def add(index: ChunkIndex, doc_id: str, coll: str, texts: list[str]) -> None:
    chunks, terms = chunks_of(texts)
    index.add(doc_id, coll, chunks, terms, None)


@pytest.mark.parametrize("depth", [0, 10])           # BM25 alone, and with the second stage
def test_another_users_documents_never_change_a_users_results(depth):
    index = ChunkIndex(1.2, 0.75, 1.0, rerank_depth=depth)
    add(index, "b1", "user:bob", BOB[:2])
    add(index, "b2", "user:bob", BOB[2:])
    mine = index.search(QUERY, ["user:bob"], 10)
    assert len(mine) == 3 and mine[0][1] > 0
    add(index, "a1", "user:alice", ALICE[:1])
    assert index.search(QUERY, ["user:bob"], 10) == mine            # ids, order and exact scores
    add(index, "a2", "user:alice", ALICE[1:] * 5)
    assert index.search(QUERY, ["user:bob"], 10) == mine
    index.compact()                                                  # as after a restart
    assert index.search(QUERY, ["user:bob"], 10) == mine
    index.remove("a1", 1)
    assert index.search(QUERY, ["user:bob"], 10) == mine
    index.remove("a2", 10)
    assert index.search(QUERY, ["user:bob"], 10) == mine
    assert index.search(QUERY, ["user:alice"], 10) == []


def test_a_single_collection_scores_as_an_index_of_it_alone():
    alone, shared = ChunkIndex(1.2, 0.75, 1.0), ChunkIndex(1.2, 0.75, 1.0)
    add(alone, "b1", "user:bob", BOB)
    add(shared, "a1", "user:alice", ALICE)
    add(shared, "b1", "user:bob", BOB)
    add(shared, "a2", "user:alice", ALICE * 3)
    for q in (QUERY, "launch", "backups disks", "pineapple43"):
        assert shared.search(q, ["user:bob"], 5) == alone.search(q, ["user:bob"], 5)


def build(colls: dict[str, list[str]], order: list[str]) -> ChunkIndex:
    index = ChunkIndex(1.2, 0.75, 1.0)
    for i, coll in enumerate(order):
        if coll in colls:
            add(index, f"d{i}", coll, colls[coll])
    return index


def test_a_group_members_statistics_include_the_group_and_a_non_members_do_not():
    colls = {"user:carol": ["zzqv9 launch notes of carol", "launch retro"],
             "group:red": ["red team zzqv9 zzqv9 launch", "pineapple42 zzqv9 launch " * 4],
             "user:dave": ["dave zzqv9 launch notes", "launch"],
             "user:alice": ALICE, "group:blue": ["blue launch zzqv9"]}
    order = ["user:alice", "user:carol", "group:red", "group:blue", "user:dave", "group:red"]
    everything = build(colls, order)
    carol = ["user:carol", "group:red"]
    only_carols = build({c: colls[c] for c in carol}, order)
    only_daves = build({"user:dave": colls["user:dave"]}, order)
    # each sees exactly what an index of their readable collections alone would give
    assert everything.search(QUERY, carol, 10) == only_carols.search(QUERY, carol, 10)
    assert everything.search(QUERY, ["user:dave"], 10) == only_daves.search(QUERY, ["user:dave"], 10)
    # carol's own chunks, searched alone but with the group in view, weigh the group's statistics
    with_group = everything.search(QUERY, ["user:carol"], 10, visible=carol)
    alone = everything.search(QUERY, ["user:carol"], 10)
    assert {k for k, _ in with_group} == {k for k, _ in alone} and with_group != alone
    everything.rerank_depth = 0                  # (the second stage's scores are relative to the best)
    full = dict(everything.search(QUERY, carol, 10))
    assert all(full[k] == s for k, s in everything.search(QUERY, ["user:carol"], 10, visible=carol))
    everything.rerank_depth = 10
    assert only_carols.search(QUERY, ["user:carol"], 10, visible=carol) == with_group
    # the group's documents change carol's scores, never dave's
    add(everything, "more", "group:red", ["zzqv9 " * 7])
    assert everything.search(QUERY, ["user:dave"], 10) == only_daves.search(QUERY, ["user:dave"], 10)
    assert everything.search(QUERY, ["user:carol"], 10, visible=carol) != with_group


async def test_bob_cannot_tell_whether_alices_private_document_holds_a_word(kb):
    """The reviewer's probe through the KnowledgeBase: bob's scores for "pineapple42 zzqv9" with
    alice's secret stored, deleted, and stored again are all equal."""
    await kb.ingest("bob", [], None, "probe.txt", "\n\n".join(BOB).encode())

    async def probe() -> list:
        return [[(h.chunk_id, h.score) for h in await kb.search("bob", [], q, 10)]
                for q in ("pineapple42 zzqv9", "pineapple43 zzqv9", QUERY)]

    seen = await probe()
    assert seen[0] and seen[0][0][1] > 0
    secret = await kb.ingest("alice", [], None, "alice_secret.txt", "\n\n".join(ALICE).encode())
    shared = await kb.ingest("carol", ["red"], "group:red", "red.txt", b"pineapple42 zzqv9 launch pineapple42")
    assert await probe() == seen
    await kb.delete("alice", [], secret.doc_id)
    assert await probe() == seen
    await kb.ingest("alice", [], None, "alice_secret.txt", "\n\n".join(ALICE).encode())
    assert await probe() == seen
    await kb.delete("carol", ["red"], shared.doc_id)
    assert await probe() == seen

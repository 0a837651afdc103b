"""The second ranking stage (server.knowledge.rerank): query-term coverage and proximity re-order
the BM25 candidates; the section's topic (in the heading path) does not count as proximity."""
from __future__ import annotations

from server.knowledge.index import ChunkIndex, chunk_terms
from server.knowledge.rerank import matches, positioned_terms, rerank

HEADING = ["Operations", "Restore"]
DECOY = "Restore: see the restore guide before any restore. Restore timeout."     # the topic, over and over
ANSWER = ("Restore a backup with nplt-restore from the latest snapshot on the storage node; the tool checks "
          "the archive, verifies every checksum and rebuilds the indexes afterwards, which can take a while "
          "on large databases. The timeout by default is 90 seconds and can be raised with --timeout.")
QUERY = "what is the restore timeout by default?"


def build(depth: int) -> ChunkIndex:
    index = ChunkIndex(1.2, 0.75, 1.0, rerank_depth=depth)
    fill = [{"text": f"Service {i} writes a {'default ' if i < 2 else ''}log file and keeps it for {i} days.",
             "location": {"heading": ["Services", f"Service {i}"]}} for i in range(20)]
    chunks = [{"text": DECOY, "location": {"heading": HEADING}},
              {"text": ANSWER, "location": {"heading": HEADING}}] + fill
    index.add("d1", "user:a", chunks, [chunk_terms(c["text"], c["location"]["heading"], 1.0) for c in chunks], None)
    return index


def test_bm25_alone_prefers_the_chunk_repeating_the_topic_and_the_rerank_the_answer():
    assert [k for k, _ in build(0).search(QUERY, ["user:a"], 2)] == [("d1", 0), ("d1", 1)]   # what the stage is for
    ranked = build(10).search(QUERY, ["user:a"], 5)
    assert [k for k, _ in ranked[:2]] == [("d1", 1), ("d1", 0)]
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    assert len(ranked) == 4          # the two chunks holding "default" too, nothing else


def test_positions_and_matches_cover_cjk_and_english_stems():
    assert positioned_terms("备份在杭州 nightly backups") == [(0, "备份"), (1, "份在"), (2, "在杭"), (3, "杭州"),
                                                             (6, "nightli"), (14, "backup")]
    found = matches("Backups run NIGHTLY；备份在杭州。", {"backup", "nightli", "杭州"})
    assert found == [(0, "backup"), (12, "nightli"), (23, "杭州")]


def test_rerank_keeps_every_candidate_and_handles_empty_input():
    passage = {"a": ("alpha beta", []), "b": ("gamma", [])}.__getitem__
    assert rerank("", [("a", 1.0)], passage, lambda t: 1, 2) == [("a", 1.0)]
    assert rerank("alpha", [], passage, lambda t: 1, 2) == []
    out = rerank("gamma", [("a", 2.0), ("b", 1.0)], passage, lambda t: 1, 2)
    assert [k for k, _ in out] == ["b", "a"]

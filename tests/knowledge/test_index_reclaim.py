"""Deleting documents frees the index's memory at once: the only document deleted leaves no
segment and no term behind; a deletion leaving a segment mostly dead rebuilds it with the live
documents' terms only (before, both waited for a later upload's merge)."""
from __future__ import annotations

import sys


def words(tag: str, n: int) -> bytes:
    return "\n\n".join(" ".join(f"{tag}{p}x{w}" for w in range(40)) for p in range(n)).encode()


def dictionary(kb) -> tuple[int, list[tuple[int, int, int]]]:
    bm25 = kb.index.bm25
    return len(bm25._stats.df), [(len(s.ids), s.n_alive, len(s.vocab)) for s in bm25._segments]


async def test_deleting_the_only_document_leaves_an_empty_index(kb):
    info = await kb.ingest("u", [], None, "big.txt", words("w", 30))
    assert info.chunks > 5 and dictionary(kb)[0] > 1000
    await kb.delete("u", [], info.doc_id)
    assert dictionary(kb) == (0, []) and len(kb.index) == 0 and len(kb.index.bm25) == 0
    assert sys.getsizeof(kb.index.bm25._stats.df) == sys.getsizeof({})          # the emptied dict re-packed


async def test_deleting_most_of_a_segment_shrinks_it_to_the_rest(kb):
    small = await kb.ingest("u", [], None, "small.txt", words("s", 2))
    alone = dictionary(kb)
    big = await kb.ingest("u", [], None, "big.txt", words("w", 30))
    [(n, live, _)] = dictionary(kb)[1]               # merged with the small one (a binary counter)
    assert n == live == small.chunks + big.chunks
    await kb.delete("u", [], big.doc_id)
    assert dictionary(kb) == alone
    for df in (kb.index.bm25._stats.df, kb.index.bm25._stats._gdf["user:u"]):          # re-packed: no table of 1,000s
        assert sys.getsizeof(df) <= 2 * sys.getsizeof(dict(df))
    assert [h.doc_id for h in await kb.search("u", [], "s1x3", 5)] == [small.doc_id]

"""The two backends side by side: one seeded random sequence of operations applied to a JSON store
and a PostgreSQL store gives the same results, call by call (records, pages, searches, listings,
errors), timestamps of activity aside."""
from __future__ import annotations

import random
from typing import Any

from storage import ChatMessage, Page, SearchHit, SessionRecord, StorageConfig, StorageError, SummaryRecord
from storage.port import open_store

WORDS = ["disk", "CPU", "load", "Straße", "内存", "日志", "error", "100%", "a_b", "quick", "Ünïcode", "x\x00y"]


def _norm(v: Any, ids: dict[str, int]) -> Any:
    if isinstance(v, SessionRecord):
        d = v.to_dict()
        del d["created_at"], d["updated_at"]
        d["session_id"] = ids[v.session_id]
        return d
    if isinstance(v, Page):
        return ([m.to_dict() for m in v.messages], v.has_more, v.next_before, v.total)
    if isinstance(v, SearchHit):
        d = v.to_dict()
        d["session_id"] = ids[v.session_id]
        return d
    if isinstance(v, ChatMessage):
        return v.to_dict()
    if isinstance(v, tuple):                          # list(): (records, cursor)
        return [_norm(r, ids) for r in v[0]], v[1] is None
    if isinstance(v, list):
        return [_norm(x, ids) for x in v]
    return v


async def test_random_operations_agree(tmp_path, pg_url):
    rng = random.Random(1717)
    stores = [await open_store(StorageConfig(root=str(tmp_path / "h"))), await open_store(StorageConfig(url=pg_url))]
    sids: list[list[str]] = [[], []]          # per backend, in creation order
    ids: list[dict[str, int]] = [{}, {}]
    clock = iter(range(10 ** 6))
    try:
        for step in range(400):
            op = rng.choices(["create", "append", "update", "rename", "model", "delete", "restore", "clear",
                              "summary", "purge", "page", "messages", "search", "list", "get"],
                             [4, 30, 5, 2, 2, 2, 3, 2, 2, 1, 6, 4, 6, 4, 3])[0]
            n = len(sids[0])
            k = rng.randrange(n) if n else None
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
            a: dict[str, Any] = {"user": rng.choice(["alice", "bob"]), "k": k, "words": words,
                                 "ts": f"2025-01-01T00:00:00.{next(clock):06d}+00:00",
                                 "before": rng.choice([None, rng.randint(1, 40)]), "limit": rng.randint(1, 12),
                                 "mid": rng.randint(0, 40), "role": rng.choice(["user", "assistant"]),
                                 "model": rng.choice([None, "m1"]), "query": rng.choice(WORDS),
                                 "title": rng.choice([None, words[:30]])}
            outs = []
            for b, st in enumerate(stores):
                sid = sids[b][k] if k is not None else "s_20250101_000000000000"
                try:
                    r = await _apply(st, op, sid, a)
                    if op == "create":
                        sids[b].append(r.session_id)
                        ids[b][r.session_id] = len(sids[b]) - 1
                    outs.append(("ok", _norm(r, ids[b])))
                except StorageError as exc:
                    outs.append(("error", type(exc).__name__, exc.code))
            assert outs[0] == outs[1], f"step {step}: {op} {a}"
    finally:
        for st in stores:
            await st.close()


async def _apply(st, op: str, sid: str, a: dict[str, Any]) -> Any:
    words = a["words"]
    if op == "create":
        return await st.create(a["user"], a["title"])
    if op == "append":
        return await st.append(sid, a["role"], words, metadata={"n": a["mid"]}, timestamp=a["ts"])
    if op == "update":
        return await st.update(sid, ChatMessage(a["mid"], "assistant", words + " (final)", a["ts"]))
    if op == "rename":
        return await st.rename(sid, words)
    if op == "model":
        return await st.set_model(sid, a["model"])
    if op == "delete":
        return await st.delete(sid)
    if op == "restore":
        return await st.restore(sid)
    if op == "clear":
        return await st.clear(sid)
    if op == "summary":
        return await st.add_summary(sid, SummaryRecord(words, 1, a["mid"], a["ts"], "s"))
    if op == "purge":
        return await st.purge(sid)
    if op == "page":
        return await st.page(sid, a["before"], a["limit"])
    if op == "messages":
        return await st.messages(sid, after_id=a["mid"])
    if op == "search":
        return await st.search(a["user"], a["query"], limit=a["limit"])
    if op == "list":
        pages, cursor = [], None
        while True:
            recs, cursor = await st.list(a["user"], before=cursor, limit=a["limit"])
            pages += recs
            if cursor is None:
                return pages, None
    return await st.get(sid)

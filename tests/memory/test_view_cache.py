"""The per-session view cache and the incremental recall index against plain storage reads: random
operations (turns, consecutive users, clears, restores, deletes, summaries moving either way,
in-place updates, forgets, LRU eviction) must never change a prompt, a trigger decision or the index.
"""
from __future__ import annotations

import random
from typing import Any

from memory_testlib import OfflineStub, ScriptedSummarizer, rand_text
from server.memory import MemoryConfig, MemoryManager
from server.memory.context import Parts, assemble, recent_turns
from server.memory.recall import RecallIndex, turn_docs
from server.memory.summarizer import message_costs, plan, plan_cut
from server.memory.tokens import ApproxTokenCounter
from storage.models import ChatMessage, SummaryRecord, ToolCall

USER = "vera"
SYS = "SYS"
C = ApproxTokenCounter()


def calls(rng: random.Random, n: int) -> list[ToolCall]:
    return [ToolCall(f"c{n}_{i}", "sys_monitor", {"q": rand_text(rng, 1, 3)}, rand_text(rng, 0, 20),
                     rng.choice(("success", "error")), step=rng.randint(0, 2)) for i in range(rng.choice((0, 0, 1, 3)))]


async def expected_context(store, sid: str, new: ChatMessage, cfg: MemoryConfig) -> Any:
    """The prompt built straight from storage, as the memory layer did before it cached anything."""
    record = await store.get(sid)
    summary = record.summary
    msgs = await store.messages(sid, after_id=summary.covers_to_id if summary else 0)
    if summary is not None and record.message_count <= len(msgs):
        summary = None
    window, older = recent_turns([m for m in msgs if m.id < new.id], cfg.context.recent_turns, C)
    parts = Parts(SYS, new.content, summary, [], window, {"summary_fallback": False, "turns_older": older})
    return assemble(parts, C, cfg.context.budget)


async def check_view(store, mm: MemoryManager, sid: str) -> None:
    """The view holds exactly the uncovered messages, with the costs the summarizer would compute."""
    record, view = await mm.sync_view(sid)
    if view is None:
        assert record.deleted
        return
    covers = record.summary.covers_to_id if record.summary else 0
    uncovered = await store.messages(sid, after_id=covers)
    assert view.ids == [m.id for m in uncovered] and view.roles == [m.role for m in uncovered]
    assert view.costs == message_costs(uncovered, C)
    assert view.summary_applies == (record.summary is not None and record.message_count > len(uncovered))
    p = plan(mm.config.summarization, mm.config.context, None, uncovered, C)
    assert plan_cut(mm.config.summarization, mm.config.context, view.roles, view.costs) == (
        len(p.covered) if p else 0)


async def random_op(rng: random.Random, store, mm: MemoryManager, sid: str, n: int) -> None:
    op = rng.choices(("turn", "users", "system", "clear", "restore", "summary", "update", "forget", "delete"),
                     weights=(30, 4, 2, 2, 2, 4, 4, 2, 1))[0]
    if op == "turn":
        await store.append(sid, "user", rand_text(rng, 0, 12))
        answer = await store.append(sid, "assistant", rand_text(rng, 0, 12) if rng.random() < 0.8 else "",
                                    tool_calls=calls(rng, n))
        given = random.Random(n).random() < 0.5        # (its own stream: the ops drawn from rng stay the same)
        await mm.after_turn(sid, USER, answer if given else None)   # as the TurnRunner does, or not
    elif op == "users":
        for _ in range(rng.randint(1, 3)):
            await store.append(sid, "user", rand_text(rng, 1, 8))
    elif op == "system":
        await store.append(sid, rng.choice(("system", "tool", "assistant")), rand_text(rng, 1, 5))
    elif op == "clear":
        await store.clear(sid)
    elif op == "restore":
        await store.restore(sid)
    elif op == "summary":
        ids = [m.id for m in await store.messages(sid)]
        if ids:                                   # any visible id: forwards, backwards, or all of it
            await store.add_summary(sid, SummaryRecord(f"summary {n}", 1, rng.choice(ids)))
    elif op == "update":
        _, view = await mm.sync_view(sid)
        if view is not None and view.tail:       # messages the view holds verbatim
            m = rng.choice(view.tail).message
            await store.update(sid, ChatMessage(m.id, m.role, m.content + " edited " + rand_text(rng, 1, 4),
                                                m.timestamp, m.tool_calls[:1], m.metadata))
    elif op == "forget":
        mm.forget_session(sid)
    else:
        await store.delete(sid)
        await store.restore(sid)


async def test_cached_prompts_equal_prompts_read_from_storage(store):
    for seed in range(6):
        rng = random.Random(seed)
        cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "recall": {"enabled": False},
                                      "context": {"recent_turns": rng.randint(0, 4), "max_sessions_cached": 1}})
        mm = MemoryManager(cfg, store, None, None, SYS)
        sids = [(await store.create(USER)).session_id for _ in range(2)]
        for n in range(70):
            sid = rng.choice(sids)                # two sessions, one cached view: eviction on the way
            await random_op(rng, store, mm, sid, n)
            new = await store.append(sid, "user", rand_text(rng, 1, 10))
            ctx = await mm.build_context(sid, USER, new, "m")
            want = await expected_context(store, sid, new, cfg)
            assert (ctx.messages, ctx.metadata) == (want.messages, want.metadata), (seed, n)
            await check_view(store, mm, sid)
        await mm.aclose()


async def test_views_rebuilt_in_a_worker_thread_give_the_same_prompts(store, monkeypatch):
    import threading

    from server.memory import manager, view
    threads: list[threading.Thread] = []

    def recording(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return view.built_view(*args)
    monkeypatch.setattr(manager, "RESET_INLINE_MAX", 0)        # every rebuild goes off the loop
    monkeypatch.setattr(manager, "built_view", recording)
    rng = random.Random(5)
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "recall": {"enabled": False},
                                  "context": {"recent_turns": 3, "max_sessions_cached": 1}})
    mm = MemoryManager(cfg, store, None, None, SYS)
    sids = [(await store.create(USER)).session_id for _ in range(2)]
    for n in range(60):
        sid = rng.choice(sids)
        await random_op(rng, store, mm, sid, n)
        new = await store.append(sid, "user", rand_text(rng, 1, 10))
        ctx = await mm.build_context(sid, USER, new, "m")
        want = await expected_context(store, sid, new, cfg)
        assert (ctx.messages, ctx.metadata) == (want.messages, want.metadata), n
        await check_view(store, mm, sid)
    assert threads and threading.main_thread() not in threads
    await mm.aclose()


async def test_summary_triggers_on_the_view_match_a_full_read(store):
    rng = random.Random(11)
    cfg = MemoryConfig.from_dict({"summarization": {"trigger": [{"type": "messages", "value": 9},
                                                                {"type": "tokens", "value": 400}],
                                                    "keep": {"type": "tokens", "value": 120}},
                                  "context": {"recent_turns": 2}})
    mm = MemoryManager(cfg, store, OfflineStub(), None, SYS)
    sid = (await store.create(USER)).session_id
    for n in range(80):
        await random_op(rng, store, mm, sid, n)
        await mm.wait_idle()
        await check_view(store, mm, sid)
    assert len((await store.get(sid)).summaries) > 3          # the summarizer really ran along
    await mm.aclose()


async def test_incremental_index_equals_a_fresh_build(store):
    rng = random.Random(3)
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "context": {"recent_turns": 1}})
    mm = MemoryManager(cfg, store, None, None, SYS)
    sid = (await store.create(USER)).session_id
    for n in range(90):
        op = rng.choices(("turn", "users", "clear", "restore", "forget"), weights=(30, 3, 1, 1, 1))[0]
        if op == "turn":
            user = await store.append(sid, "user", rand_text(rng, 1, 12))
            await mm.build_context(sid, USER, user, "m")
            await store.append(sid, "assistant", rand_text(rng, 0, 12), tool_calls=calls(rng, n))
        elif op == "users":
            await store.append(sid, "user", rand_text(rng, 1, 8))
        elif op == "clear":
            await store.clear(sid)
        elif op == "restore":
            await store.restore(sid)
        else:
            mm.forget_session(sid)
        await mm.after_turn(sid, USER)
        uidx = mm.indexes.user(USER)
        async with uidx.lock:                    # what a search does first (indexing is lazy)
            await mm.indexes.sync(uidx, sid)
        fresh = RecallIndex()
        docs, upto = turn_docs(sid, await store.messages(sid), final=False)
        fresh.add_turns(sid, docs, upto)
        idx = uidx.index
        assert idx.docs == fresh.docs, n
        assert all(idx.bm25.terms_of(k) == fresh.bm25.terms_of(k) for k in fresh.docs), n
    await mm.aclose()


# -- invalidation, one case at a time -----------------------------------------------------------------
def texts(ctx) -> list[str]:
    return [m.get("content") or "" for m in ctx.messages]


async def turn(store, mm, sid: str, text: str, answer: str = "ok"):
    user = await store.append(sid, "user", text)
    ctx = await mm.build_context(sid, USER, user, "m")
    await store.append(sid, "assistant", answer)
    await mm.after_turn(sid, USER)
    return ctx


async def test_turns_are_indexed_when_a_search_needs_them_not_after_each_turn(store):
    """Recall indexing is lazy: a finished turn only marks its session stale; a prompt whose window
    holds every turn of the session does not index it at all; recall in a longer session and a
    search across the user's sessions bring the index up to date first."""
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "user_memory": {"enabled": False},
                                  "context": {"recent_turns": 2}})
    mm = MemoryManager(cfg, store, None, None, SYS)
    a = (await store.create(USER)).session_id
    b = (await store.create(USER)).session_id

    async def turn(sid: str, text: str, answer: str):
        user = await store.append(sid, "user", text)
        built = await mm.build_context(sid, USER, user, "m")
        await store.append(sid, "assistant", answer)
        await mm.after_turn(sid, USER)
        return built
    await turn(a, "the redis cluster lives on host kestrel", "noted: kestrel")
    await turn(a, "what about the backups", "they run nightly")
    uidx = mm.indexes.user(USER)
    assert a not in uidx.index.indexed_upto             # two turns, both in the window: nothing indexed
    hits = await mm.search(USER, "kestrel")             # the first search indexes every session
    assert {h["session_id"] for h in hits} == {a} and uidx.complete and not uidx.stale
    await turn(b, "the staging database is on host osprey", "noted: osprey")
    assert uidx.stale == {b} and b not in uidx.index.indexed_upto
    hits = await mm.search(USER, "osprey")              # a stale session is synced before searching
    assert {h["session_id"] for h in hits} == {b} and not uidx.stale
    await turn(a, "logs rotate weekly", "ok")
    assert uidx.stale == {a}
    built = await turn(a, "which host was the redis cluster on?", "the one you named")
    # the first turn is older than the window now: the session is synced and the turn recalled
    assert uidx.index.indexed_upto[a] >= 6
    assert "kestrel" in str(built.messages[:-1])
    await mm.aclose()


async def test_after_turn_takes_the_stored_answer_into_the_view_without_a_read(store, monkeypatch):
    cfg = MemoryConfig.from_dict({"context": {"recent_turns": 2}})
    mm = MemoryManager(cfg, store, OfflineStub(), None, SYS)
    sid = (await store.create(USER)).session_id
    reads: list[Any] = []
    read = mm._read

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return await read(*args, **kwargs)
    monkeypatch.setattr(mm, "_read", counted)
    for n in range(3):
        user = await store.append(sid, "user", f"question {n}")
        await mm.build_context(sid, USER, user, "m")
        answer = await store.append(sid, "assistant", f"answer {n}", tool_calls=calls(random.Random(n), n))
        before = len(reads)
        await mm.after_turn(sid, USER, answer)
        assert len(reads) == before                     # the answer came from the turn, not from storage
        view = mm._views[sid]
        stored = await store.messages(sid)
        assert view.ids == [m.id for m in stored] and view.costs == message_costs(stored, C)
    # a message stored by someone else in between: the answer does not follow the view, so it syncs
    await store.append(sid, "user", "from another client")
    late = await store.append(sid, "assistant", "late answer")
    before = len(reads)
    await mm.after_turn(sid, USER, late)
    assert len(reads) == before + 1 and mm._views[sid].ids == [m.id for m in await store.messages(sid)]
    await check_view(store, mm, sid)
    await mm.aclose()


async def test_restore_after_clear_brings_back_window_and_summary(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False},
                                               "context": {"recent_turns": 2}}), store, None, None, SYS)
    sid = (await store.create(USER)).session_id
    for i in range(4):
        await turn(store, mm, sid, f"question {i}")
    await store.add_summary(sid, SummaryRecord("the early part", 1, 4))
    ctx = await turn(store, mm, sid, "before the clear")
    assert ctx.metadata["summary_used"] == 4 and "question 3" in texts(ctx)
    await store.clear(sid)
    ctx = await turn(store, mm, sid, "after the clear")
    assert ctx.metadata["summary_used"] is None and ctx.metadata["turns_kept"] == 0
    await store.restore(sid)
    ctx = await turn(store, mm, sid, "after the restore")
    # clear dropped the summary with what it summarized: the restored turns come back unsummarized
    assert ctx.metadata["summary_used"] is None and "after the clear" in texts(ctx)
    assert ctx.metadata["turns_older"] == 4                   # questions 0..3 (before the clear)
    await mm.aclose()


async def test_in_place_update_of_a_window_message_is_in_the_next_prompt(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, SYS)
    sid = (await store.create(USER)).session_id
    await turn(store, mm, sid, "how is the disk?", "partial answer")
    [_, answer] = await store.messages(sid)
    await store.update(sid, ChatMessage(answer.id, "assistant", "final answer: 42% used", answer.timestamp))
    ctx = await turn(store, mm, sid, "and now?")
    assert "final answer: 42% used" in texts(ctx) and "partial answer" not in texts(ctx)
    await mm.aclose()


async def test_new_summary_moves_the_window_and_an_older_one_rebuilds_it(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}, "recall": {"enabled": False},
                                               "context": {"recent_turns": 10}}), store, None, None, SYS)
    sid = (await store.create(USER)).session_id
    for i in range(6):
        await turn(store, mm, sid, f"question {i}")
    await store.add_summary(sid, SummaryRecord("up to question 3", 1, 8))
    ctx = await turn(store, mm, sid, "next")
    assert "question 3" not in texts(ctx) and "question 4" in texts(ctx) and ctx.metadata["summary_used"] == 8
    await store.add_summary(sid, SummaryRecord("only question 0", 1, 2))       # moves backwards
    ctx = await turn(store, mm, sid, "again")
    assert "question 1" in texts(ctx) and ctx.metadata["summary_used"] == 2
    await mm.aclose()


async def test_views_are_bounded_and_evicted_sessions_stay_correct(store):
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "context": {"max_sessions_cached": 2}})
    mm = MemoryManager(cfg, store, None, None, SYS)
    sids = [(await store.create(USER)).session_id for _ in range(4)]
    for round_ in range(3):
        for i, sid in enumerate(sids):
            ctx = await turn(store, mm, sid, f"session {i} round {round_}")
            assert ctx.metadata["turns_kept"] == round_
            assert all(f"session {i} round {r}" in texts(ctx) for r in range(round_))
            assert len(mm._views) <= 2
    await mm.aclose()


async def test_quiet_turns_start_no_summary_task(store):
    gate_agent = ScriptedSummarizer(["S"])
    cfg = MemoryConfig.from_dict({"summarization": {"trigger": {"type": "messages", "value": 6},
                                                    "keep": {"type": "messages", "value": 2}}})
    mm = MemoryManager(cfg, store, gate_agent, None, SYS)
    sid = (await store.create(USER)).session_id
    for i in range(2):
        await turn(store, mm, sid, f"q{i}")
        assert mm.summary_tasks_idle()            # 2 and 4 messages: nothing fires, no task at all
    await turn(store, mm, sid, "q2")              # 6 messages: the trigger fires
    assert not mm.summary_tasks_idle()
    await mm.wait_idle()
    assert [s.covers_to_id for s in (await store.get(sid)).summaries] == [4] and len(gate_agent.calls) == 1
    await mm.aclose()


async def test_deleted_session_still_gets_a_prompt(store):
    mm = MemoryManager(MemoryConfig.from_dict({"summarization": {"enabled": False}}), store, None, None, SYS)
    sid = (await store.create(USER)).session_id
    await turn(store, mm, sid, "the rack is in row 7")
    await store.delete(sid)
    new = await store.append(sid, "user", "which row?")
    ctx = await mm.build_context(sid, USER, new, "m")
    assert "the rack is in row 7" in texts(ctx) and ctx.metadata["turns_kept"] == 1
    await store.restore(sid)
    assert "the rack is in row 7" in texts(await turn(store, mm, sid, "row?"))
    await mm.aclose()


class PlainStore:
    """Only the async store API (no ``.sync``): the manager falls back to two awaited reads."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        if name == "sync":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_store_without_sync_api_gives_the_same_prompts(store):
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "context": {"recent_turns": 2}})
    fast = MemoryManager(cfg, store, None, None, SYS)
    plain = MemoryManager(cfg, PlainStore(store), None, None, SYS)
    assert fast._sync_store is not None and plain._sync_store is None
    rng = random.Random(8)
    sid = (await store.create(USER)).session_id
    for n in range(25):
        if n == 12:
            await store.clear(sid)
        user = await store.append(sid, "user", rand_text(rng, 1, 12))
        a = await fast.build_context(sid, USER, user, "m")
        b = await plain.build_context(sid, USER, user, "m")
        assert (a.messages, a.metadata) == (b.messages, b.metadata)
        await store.append(sid, "assistant", rand_text(rng, 1, 12), tool_calls=calls(rng, n))
        await fast.after_turn(sid, USER)
        await plain.after_turn(sid, USER)
    await fast.aclose()
    await plain.aclose()

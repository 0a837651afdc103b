"""Per-turn cost of the memory layer (``MemoryManager``) on a real ``AsyncHistoryStore``.

Usage: python bench/memory_turn.py [--sizes 20 200 2000] [--turns 40] [--mode both]
                                   [--summaries-every 10] [--profile SIZE]

For each session size (stored turns, every third one with tool calls) and mode, a session is
written straight into a store on a temp dir, then ``--turns`` new turns run as the turn runner
drives them: append the user message, ``build_context`` (timed: on the turn's critical path),
append the answer, ``after_turn`` (timed: runs after TURN_END), then the background work it
scheduled (summaries) is awaited ("bg", mean). The first turn of a session (cold: view and
recall index built from storage) is reported apart, with "stall": the longest time the event loop
was blocked during its context build (a 0.5 ms ticker runs beside it).

Modes: ``summarized`` = default config, offline agent (extractive summaries), the session already
summarized up to its last 20 messages, with one stored summary per ``--summaries-every`` turns as
the rolling summarizer leaves them (``store.get`` returns every one of them); ``unsummarized`` =
summarization disabled, so every stored message is uncovered (worst case for the view).

Baseline measured in the same run ("floor"): the storage round trips a memory layer cannot avoid,
``store.get`` plus ``store.messages`` of the new message, for the same session. Figures are
milliseconds (p50/p90); "ratio" = (build + after) p50 / floor p50.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from server.memory import MemoryConfig, MemoryManager  # noqa: E402
from storage import AsyncHistoryStore, StorageConfig  # noqa: E402
from storage.models import SummaryRecord, ToolCall  # noqa: E402

USER = "bench-user"
STOP = "the a is on of to and i it that for you was with my this be have are what can we at".split()
DOMAIN = ("cpu disk memory nginx load uptime swap inode latency kernel deploy rollback cron backup certificate "
          "queue worker redis postgres replica shard timeout retry alert pager host restart service error").split()
CJK = ("磁盘使用率", "内存", "日志文件", "服务器重启", "备份任务", "告警", "网络延迟")


def vocabulary(n: int = 4000) -> tuple[list[str], list[float]]:
    """Domain words first, then pronounceable pseudo-words; Zipf weights (s = 1.1) by rank."""
    rng = random.Random(7)
    syll = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = list(DOMAIN)
    seen = set(words)
    while len(words) < n:
        w = "".join(rng.choices(syll, k=rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words, [1.0 / (r + 1) ** 1.1 for r in range(n)]


VOCAB, WEIGHTS = vocabulary()
class Offline:
    """The offline agent as the memory layer sees it (extractive summaries)."""
    name, offline, default_model = "offline", True, "offline"


def text(rng: random.Random, lo: int, hi: int) -> str:
    """Chat-like text: about a third stopwords, content words by Zipf rank, now and then some Chinese."""
    n = rng.randint(lo, hi)
    words = rng.choices(VOCAB, WEIGHTS, k=n)
    for i in range(0, n, 3):
        words[i] = rng.choice(STOP)
    if rng.random() < 0.1:
        words.append(rng.choice(CJK))
    return " ".join(words)


def calls_for(rng: random.Random, turn: int) -> list[ToolCall]:
    if turn % 3:
        return []
    return [ToolCall(f"c{turn}_{i}", "sys_monitor", {"metric": rng.choice(("cpu", "disk", "memory"))},
                     text(rng, 20, 60), step=i) for i in range(rng.randint(1, 2))]


def populate(store: AsyncHistoryStore, sid: str, turns: int, rng: random.Random) -> None:
    """Write ``turns`` finished turns synchronously (setup, not timed)."""
    for t in range(turns):
        store.sync.append(sid, "user", text(rng, 5, 30))
        store.sync.append(sid, "assistant", text(rng, 10, 80), tool_calls=calls_for(rng, t))


def config(mode: str) -> MemoryConfig:
    if mode == "unsummarized":
        return MemoryConfig.from_dict({"summarization": {"enabled": False}})
    return MemoryConfig()


async def setup(root: str, size: int, mode: str, every: int) -> tuple[AsyncHistoryStore, str, random.Random]:
    rng = random.Random(size)
    store = AsyncHistoryStore(StorageConfig(root=root, durability="batched"))
    sid = (await store.create(USER)).session_id
    await asyncio.to_thread(populate, store, sid, size, rng)
    if mode == "summarized" and size * 2 > 20:
        msgs = await store.messages(sid)
        ends = [2 * t for t in range(every, size, every)] if every else []
        for end in [e for e in ends if e < len(msgs) - 20] + [msgs[-21].id]:
            await store.add_summary(sid, SummaryRecord("Earlier: " + text(rng, 200, 300), 1, end))
    return store, sid, rng


async def floor(root: str, size: int, mode: str, every: int, n_turns: int) -> list[float]:
    """The unavoidable storage round trips of a turn: the record and the new message."""
    store, sid, rng = await setup(root, size, mode, every)
    out = []
    for _ in range(n_turns):
        user = await store.append(sid, "user", text(rng, 5, 30))
        t0 = time.perf_counter()
        await store.get(sid)
        await store.messages(sid, after_id=user.id - 1)
        out.append((time.perf_counter() - t0) * 1e3)
        await store.append(sid, "assistant", text(rng, 10, 80))
    await store.close()
    return out


class StallMeter:
    """The longest time the event loop did not run a 0.5 ms ticker (a blocked loop shows here)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.0005)
            now = loop.time()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> StallMeter:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def run_one(root: str, size: int, mode: str, every: int, n_turns: int,
                  profile: cProfile.Profile | None) -> dict[str, list[float]]:
    store, sid, rng = await setup(root, size, mode, every)
    mm = MemoryManager(config(mode), store, Offline(), None, "SYS")
    out: dict[str, list[float]] = {"build": [], "after": [], "bg": [], "cold": [], "stall": []}
    for t in range(n_turns + 1):
        user = await store.append(sid, "user", text(rng, 5, 30))
        if profile is not None and t:
            profile.enable()
        t0 = time.perf_counter()
        if t == 0:
            async with StallMeter() as meter:
                await mm.build_context(sid, USER, user, "m")
            out["stall"].append(meter.longest * 1e3)
        else:
            await mm.build_context(sid, USER, user, "m")
        t1 = time.perf_counter()
        if profile is not None:
            profile.disable()
        await store.append(sid, "assistant", text(rng, 10, 80), tool_calls=calls_for(rng, size + t))
        if profile is not None and t:
            profile.enable()
        t2 = time.perf_counter()
        await mm.after_turn(sid, USER)
        t3 = time.perf_counter()
        await mm.wait_idle()
        t4 = time.perf_counter()
        if profile is not None:
            profile.disable()
        if t == 0:
            out["cold"].append((t1 - t0 + t3 - t2) * 1e3)
            continue
        out["build"].append((t1 - t0) * 1e3)
        out["after"].append((t3 - t2) * 1e3)
        out["bg"].append((t4 - t3) * 1e3)
    await mm.aclose()
    await store.close()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 2000])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--mode", choices=("summarized", "unsummarized", "both"), default="both")
    ap.add_argument("--summaries-every", type=int, default=10, help="stored summaries: one per N turns (0: one)")
    ap.add_argument("--profile", type=int, default=None, help="cProfile the timed turns of this size")
    args = ap.parse_args()
    modes = ("summarized", "unsummarized") if args.mode == "both" else (args.mode,)
    print(f"{'mode':<13}{'turns':>6} {'build p50/p90':>15} {'after p50/p90':>15} {'bg mean':>8} "
          f"{'cold':>8} {'stall':>6} {'floor':>7} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for size in args.sizes:
                base = statistics.median(await floor(f"{tmp}/f{mode}{size}", size, mode, args.summaries_every,
                                                     args.turns))
                prof = cProfile.Profile() if args.profile == size else None
                r = await run_one(f"{tmp}/{mode}{size}", size, mode, args.summaries_every, args.turns, prof)
                b50, a50 = statistics.median(r["build"]), statistics.median(r["after"])
                print(f"{mode:<13}{size:>6} {b50:>7.3f}/{pct(r['build'], .9):<7.3f} "
                      f"{a50:>7.3f}/{pct(r['after'], .9):<7.3f} {statistics.mean(r['bg']):>8.3f} "
                      f"{r['cold'][0]:>8.1f} {r['stall'][0]:>6.1f} {base:>7.3f} {(b50 + a50) / base:>5.1f}x")
                if prof is not None:
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(35)
                    print(s.getvalue())


if __name__ == "__main__":
    asyncio.run(main())

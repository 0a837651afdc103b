"""TUI benchmark: first paint of a 10,000-message session, and render cost per streamed delta.

1. First paint. A real server runs in-process on a store pre-filled with one session of N messages
   (default 10,000). From the moment the app starts until the newest messages are laid out on screen
   ("first paint"), and until the whole newest page (50 messages) is mounted ("full page"). Baseline
   in the same run: the same measurement on an empty session. Target: first paint < 300 ms.
2. Streaming. A 5,000-token Markdown answer (paragraphs, lists, code blocks) is streamed as one
   delta per token into a live assistant message the way the TUI does it (Markdown.append of each
   fragment, then a screen refresh), timing every delta in wall and CPU time; the median cost of the
   first 10% of deltas is compared with the last 10% (must stay flat: ratio near 1; CPU time is the
   steadier figure on a shared machine). The same answer is then streamed end to end from the
   server through the client library and the TUI (which coalesces the deltas already queued into
   one append), for the total time and deltas/s; baseline in the same run: the same answer read by
   the client library alone (no rendering), i.e. the rate the server streams at.

    python bench/tui.py [--messages 10000] [--tokens 5000] [--runs 5]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from client.config import ClientConfig  # noqa: E402
from client.connection import Client  # noqa: E402
from client.tui.app import NpltApp  # noqa: E402
from client.tui.chat import FIRST_PAINT, ChatView  # noqa: E402
from client.tui.message import MessageView  # noqa: E402
from protocol.objects import ChatMessage  # noqa: E402
from protocol.server_events import TurnEnd  # noqa: E402
from server.agent.base import TurnRequest, TurnResult, TurnSink  # noqa: E402
from storage import HistoryStore, StorageConfig  # noqa: E402
from testkit.server import running_server  # noqa: E402

SIZE = (120, 40)
WORDS = ("the server keeps every session on disk and the client shows the newest page first while older "
         "pages load by cursor when you scroll up").split()


def answer_tokens(n: int) -> list[str]:
    """A Markdown answer of ``n`` tokens: paragraphs, a bullet list and a code block every ~200 tokens."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        block = i % 4
        if block == 3:
            out += ["\n\n```python\n"] + [f"x{j} = {j}\n" for j in range(8)] + ["```\n\n"]
        elif block == 2:
            out += [f"- item {j} {WORDS[j % len(WORDS)]}\n" for j in range(6)] + ["\n"]
        else:
            out += [WORDS[(i * 7 + j) % len(WORDS)] + " " for j in range(60)] + ["\n\n"]
        i += 1
    return out[:n]


def message_text(i: int) -> str:
    if i % 10 == 9:
        return f"Result {i}:\n\n```\nvalue = {i}\n```\n"
    if i % 2:
        return f"Answer {i}: **{WORDS[i % len(WORDS)]}** and a list:\n\n- one\n- two\n"
    return f"Question {i} about {WORDS[i % len(WORDS)]}?"


def prefill(root: Path, n: int) -> tuple[str, str]:
    store = HistoryStore(StorageConfig(root=str(root), durability="batched", batch_ms=200))
    empty = store.create("local", title="empty")
    big = store.create("local", title=f"{n} messages")
    for i in range(n):
        store.append(big.session_id, "user" if i % 2 == 0 else "assistant", message_text(i))
    store.close()
    return empty.session_id, big.session_id


class TokenAgent:
    """Streams a fixed list of tokens as deltas."""
    name, offline, default_model = "bench", True, "bench"

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens

    def models(self) -> list[str]:
        return ["bench"]

    async def complete(self, messages: list[dict[str, Any]], model: str | None = None) -> str:
        return ""

    async def aclose(self) -> None:
        return None

    async def run_turn(self, req: TurnRequest, sink: TurnSink) -> TurnResult:
        await sink.status("generating")
        for t in self.tokens:
            await sink.delta(t)
        return TurnResult(content="".join(self.tokens))


async def poll(pilot: Any, pred: Any, timeout: float = 60.0) -> None:
    deadline = time.perf_counter() + timeout
    while not pred():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.001)


async def measure_open(addr: tuple[str, int], session_id: str, expect: int) -> tuple[float, float, float]:
    """Seconds from app start to the first paint (wall, CPU) and to the full newest page (wall)."""
    cfg = ClientConfig(host=addr[0], port=addr[1])
    app = NpltApp(cfg, client=Client(addr[0], addr[1], session_id=session_id))  # HELLO attaches to it
    t0, c0 = time.perf_counter(), time.process_time()
    async with app.run_test(size=SIZE) as pilot:
        chat = app.query_one(ChatView)

        def shown() -> bool:
            if chat.session_id != session_id or app.controller._loads:
                return False
            return expect == 0 or len(chat.messages()) >= min(expect, FIRST_PAINT)
        await poll(pilot, shown)
        painted: list[float] = []
        # the first screen refresh after the newest messages were mounted is the first paint
        app.screen.call_after_refresh(lambda: painted.extend((time.perf_counter(), time.process_time())))
        await poll(pilot, lambda: bool(painted))
        first, first_cpu = painted[0] - t0, painted[1] - c0
        assert expect == 0 or chat.messages()[-1].region.height > 0, "not laid out at the first paint"
        await poll(pilot, lambda: not chat.backfilling and len(chat.messages()) == expect
                   and all(v.region.height > 0 for v in chat.messages()))
        full = time.perf_counter() - t0
    return first, first_cpu, full


async def bench_first_paint(tmp: Path, n: int, runs: int) -> None:
    empty, big = await asyncio.to_thread(prefill, tmp / "history", n)
    async with running_server(tmp) as (_, addr):
        await measure_open(addr, big, 50)  # warm-up (imports, store load)
        base = [await measure_open(addr, empty, 0) for _ in range(runs)]
        res = [await measure_open(addr, big, 50) for _ in range(runs)]
    b, bc = statistics.median(x[0] for x in base), statistics.median(x[1] for x in base)
    f, fc = statistics.median(x[0] for x in res), statistics.median(x[1] for x in res)
    p = statistics.median(x[2] for x in res)
    print(f"first paint, empty session (baseline):  {b * 1000:7.1f} ms wall, {bc * 1000:7.1f} ms CPU "
          f"(median of {runs})")
    print(f"first paint, {n}-message session:     {f * 1000:7.1f} ms wall, {fc * 1000:7.1f} ms CPU "
          f"({f / b:.2f}x baseline)  target < 300 ms: {'OK' if f < 0.3 else 'MISSED'}")
    print(f"full newest page (50 messages) mounted: {p * 1000:7.1f} ms wall")


async def library_rate(addr: tuple[str, int], tokens: list[str]) -> float:
    """Seconds to stream the answer to the client library alone (baseline: no rendering)."""
    async with Client(addr[0], addr[1]) as client:
        await client.session_new(title="library baseline")
        t0 = time.perf_counter()
        reply = await client.chat_send("stream please")
        while True:
            event = await client.next_event(timeout=300)
            if isinstance(event, TurnEnd) and event.turn_id == reply.turn_id:
                break
        total = time.perf_counter() - t0
        assert event.message is not None and event.message.content == "".join(tokens)
    return total


async def bench_stream(tmp: Path, tokens: list[str]) -> None:
    async with running_server(tmp, agent=TokenAgent(tokens)) as (_, addr):
        base = await library_rate(addr, tokens)
        app = NpltApp(ClientConfig(host=addr[0], port=addr[1]))
        async with app.run_test(size=SIZE) as pilot:
            chat = app.query_one(ChatView)
            await poll(pilot, lambda: chat.session_id is not None and app.controller._loads == 0)
            # (a) render cost per delta, one Markdown.append per token plus a screen refresh. A screenful
            # of earlier messages sits above, as in a real conversation, so the view scrolls from the start.
            for i in range(12):
                await chat.add_message(ChatMessage(i + 1, "user" if i % 2 == 0 else "assistant", message_text(i)))
            view = await chat.add_message(ChatMessage(None, "assistant", ""), turn_id="bench")
            wall, cpu = [], []
            for t in tokens:
                w0, c0 = time.perf_counter(), time.process_time()
                await view.append(t)      # the TUI's path: MarkdownStream, freezing finished paragraphs
                await view.stop_stream()  # flush now: no coalescing, one Markdown.append per delta
                await pilot.pause(0)      # process pending messages and refresh the screen (one frame)
                wall.append(time.perf_counter() - w0)
                cpu.append(time.process_time() - c0)
            assert view.content == "".join(tokens)
            tenth = max(1, len(tokens) // 10)
            for label, costs in (("wall", wall), ("cpu ", cpu)):
                first, last = statistics.median(costs[:tenth]), statistics.median(costs[-tenth:])
                print(f"render per delta ({label}, median), first 10%: {first * 1000:6.2f} ms   "
                      f"last 10%: {last * 1000:6.2f} ms   ratio {last / first:.2f}  ({len(tokens)} deltas)")
            await chat.reset(chat.session_id)
            # (b) end to end: server -> client library -> TUI (queued deltas coalesced into one append)
            appends = 0
            plain_append = MessageView.append

            async def counting_append(self: MessageView, text: str) -> None:
                nonlocal appends
                appends += 1
                await plain_append(self, text)
            MessageView.append = counting_append  # type: ignore[method-assign]
            try:
                t0 = time.perf_counter()
                await app.controller.send("stream please")
                await poll(pilot, lambda: any(m.role == "assistant" and m.message_id and m.turn_id is None
                                              for m in chat.messages()), timeout=300)
                total = time.perf_counter() - t0
            finally:
                MessageView.append = plain_append  # type: ignore[method-assign]
            done = next(m for m in chat.messages() if m.role == "assistant")
            assert done.content == "".join(tokens)
            n = len(tokens)
            print(f"end to end, client library only (baseline): {base:6.2f} s  {n / base:9,.0f} deltas/s")
            print(f"end to end deltas/s through the TUI:        {total:6.2f} s  {n / total:9,.0f} deltas/s  "
                  f"({base / total:.2f}x baseline; {n} deltas rendered in {appends} appends)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=5_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nplt-bench-tui-") as d:
        sys.stdout.reconfigure(line_buffering=True)
        asyncio.run(bench_first_paint(Path(d) / "paint", args.messages, args.runs))
        asyncio.run(bench_stream(Path(d) / "stream", answer_tokens(args.tokens)))


if __name__ == "__main__":
    main()

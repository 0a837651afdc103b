"""Soak phase: SIGKILL restarts under chat load. Clients chat in their own sessions (one turn at a
time, so every acknowledged user message was stored before its reply); the scripted LLM answers most
turns at once and stalls some, so kills land mid-turn too. After every restart the sessions are
reattached; at the end the server is stopped gently and the store read directly: every acknowledged
message must be there exactly once, and no session may end with an unanswered question (turns cut
by a kill are closed as ``interrupted`` at the next start)."""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

from protocol import MsgType
from soak_common import Row, SoakServer
from storage import HistoryStore, StorageConfig
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client


async def _chatter(server: SoakServer, sid: str | None, acked: dict[str, list[str]], tag: str,
                   sids: list[str], slot: int) -> None:
    try:
        c = await V3Client.connect(("127.0.0.1", server.port), session_id=sid)
    except (OSError, ConnectionError, asyncio.TimeoutError):
        return
    sid = c.session_id
    sids[slot] = sid
    n = 0
    try:
        while True:
            text = f"{tag} message {n}"
            r = await c.call(MsgType.CHAT_TEXT, timeout=30, text=text)
            if not r.get("queued"):
                acked.setdefault(sid, []).append(text)
            n += 1
            await c.turn_events(r["turn_id"], timeout=60)
    except Exception:  # noqa: BLE001 - the kill ends every client one way or another
        pass
    finally:
        await c.close()


async def run(server: SoakServer, row: Row, *, restarts: int, clients: int, budget_s: float,
              seed: int = 15) -> None:
    r = random.Random(seed)
    acked: dict[str, list[str]] = {}
    sids: list[str | None] = [None] * clients
    deadline = time.monotonic() + budget_s
    kills = 0
    async with ScriptedLLM() as llm:
        server.env = {**server.env, "NPLT_LLM_BASE_URL": llm.base_url}
        for i in range(restarts):
            if time.monotonic() > deadline:
                row.failures.append(f"time budget over after {kills} kills")
                break
            llm.push(*[Reply.stalled("cut ", "short") if r.random() < 0.2 else Reply.text("fine ", "answer")
                       for _ in range(clients * 20)])
            try:
                await server.start()
            except AssertionError as exc:
                server.crashes += 1
                row.failures.append(f"restart {i} failed: {exc}"[:200])
                break
            tasks = [asyncio.create_task(_chatter(server, sids[k], acked, f"r{i}c{k}", sids, k))
                     for k in range(clients)]
            await asyncio.sleep(r.uniform(0.3, 1.2))   # chat load for a random time, then the kill
            server.kill()
            kills += 1
            await asyncio.gather(*tasks)
        await server.start()   # the last start closes what the last kill cut; then a gentle stop
        await server.stop()
    store = HistoryStore(StorageConfig(root=str(server.data)))
    lost = dup = trailing = interrupted = 0
    try:
        for sid, texts in acked.items():
            msgs = store.messages(sid)
            seen = Counter(m.content for m in msgs if m.role == "user")
            lost += sum(1 for t in texts if not seen[t])
            dup += sum(1 for t in texts if seen[t] > 1)
            trailing += bool(msgs) and msgs[-1].role == "user"
            interrupted += sum(1 for m in msgs if m.metadata.get("interrupted"))
    finally:
        store.close()
    total = sum(len(v) for v in acked.values())
    row.lost = lost
    row.tried = (f"{kills} SIGKILLs under {clients} chatting clients, {total} acknowledged messages, "
                 f"{interrupted} turns closed as interrupted")
    row.extra.update(kills=kills, acked=total, interrupted=interrupted)
    if dup:
        row.failures.append(f"{dup} acknowledged messages stored twice")
    if trailing:
        row.failures.append(f"{trailing} sessions end with an unanswered question")

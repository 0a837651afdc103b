"""Helpers for the memory tests: scripted agents, a notify collector, random history generators,
and the prompt invariant checks shared by the property tests.
"""
from __future__ import annotations

import asyncio
import random
from typing import Any

from server.handlers.redo import _supersede as supersede
from server.memory import MemoryConfig, MemoryManager
from storage.models import ChatMessage, ToolCall

class ScriptedSummarizer:
    """An online Agent whose ``complete`` is scripted: replies (str or Exception) in order, then the last.

    ``gate``: when set to an unset asyncio.Event, each call waits for it (``started`` is set first).
    """
    name = "scripted"
    offline = False
    default_model = "chat-model"

    def __init__(self, replies: list[Any] | None = None, gate: asyncio.Event | None = None) -> None:
        self.replies = list(replies or ["SUMMARY"])
        self.gate = gate
        self.calls: list[tuple[list[dict], str | None]] = []
        self.started = asyncio.Event()

    def models(self) -> list[str]:
        return [self.default_model]

    async def run_turn(self, req: Any, sink: Any) -> Any:      # not used by the memory layer
        raise NotImplementedError

    async def complete(self, messages: list[dict], model: str | None = None) -> str:
        self.calls.append((messages, model))
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        reply = self.replies[min(len(self.calls) - 1, len(self.replies) - 1)]
        if callable(reply):
            reply = reply(messages)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def aclose(self) -> None:
        return None


class OfflineStub:
    """The shape of the offline agent as the memory layer sees it (offline=True: extractive summaries)."""
    name = "offline"
    offline = True
    default_model = "offline"

    async def complete(self, messages: list[dict], model: str | None = None) -> str:
        raise AssertionError("the memory layer must not call complete() on an offline agent")


class Notifications:
    """Collects notify(kind, session_id, payload) calls; ``wait`` polls with a deadline."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict]] = []
        self._cond = asyncio.Condition()

    async def __call__(self, kind: str, session_id: str, payload: dict) -> None:
        async with self._cond:
            self.events.append((kind, session_id, payload))
            self._cond.notify_all()

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.events]

    async def wait(self, kind: str, n: int = 1, timeout: float = 10.0) -> None:
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: self.kinds().count(kind) >= n), timeout)


# -- random histories -----------------------------------------------------------------------------
WORDS = ("cpu disk memory nginx load uptime swap inode latency kernel deploy rollback cron backup "
         "certificate queue worker redis postgres replica shard timeout retry alert pager host "
         "磁盘 内存 日志 服务器 备份 告警 负载 网络 延迟 进程").split()
TOOLS = ("sys_monitor", "processes", "network_check", "read_log", "clock", "history_search")
STATUSES = ("success", "error", "timeout", "running")


def rand_text(rng: random.Random, lo: int = 1, hi: int = 25) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))


def rand_history(rng: random.Random, n_items: int) -> list[ChatMessage]:
    """Messages as storage may hold them: mostly user/assistant turns with tool calls (several steps,
    empty or unfinished results, duplicate ids now and then), plus stray tool and system messages,
    consecutive users, assistants with no user before them, and id gaps (cleared messages)."""
    msgs: list[ChatMessage] = []
    next_id = rng.randint(1, 4)
    ids: list[str] = []
    for _ in range(n_items):
        kind = rng.choices(("user", "assistant", "tool", "system"), weights=(40, 40, 7, 3))[0]
        calls: list[ToolCall] = []
        meta: dict[str, Any] = {}
        content = rand_text(rng)
        if kind == "assistant":
            for _ in range(rng.choice((0, 0, 1, 1, 2, 3, 5))):
                cid = rng.choice(ids) if ids and rng.random() < 0.05 else f"call_{len(ids)}"
                ids.append(cid)
                calls.append(ToolCall(cid, rng.choice(TOOLS), {"q": rand_text(rng, 1, 3)},
                                      "" if rng.random() < 0.15 else rand_text(rng, 1, 40),
                                      rng.choice(STATUSES), 0.01, step=rng.randint(0, 2)))
            if calls and rng.random() < 0.3:
                content = ""
        elif kind == "tool":
            meta = {"tool_call_id": rng.choice(ids) if ids and rng.random() < 0.5 else "call_x"}
        msgs.append(ChatMessage(next_id, kind, content, tool_calls=calls, metadata=meta))
        next_id += rng.choice((1, 1, 1, 1, 2))
    return msgs


# -- prompt invariants ------------------------------------------------------------------------------
def check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool_calls message is followed by exactly one result per call id, and every
    tool message belongs to the assistant message right before its group."""
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m["role"] != "tool", f"orphaned tool result at {i}: {m}"
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            assert len(ids) == len(set(ids)), f"duplicate call ids at {i}: {ids}"
            j = i + 1
            got = []
            while j < len(messages) and messages[j]["role"] == "tool":
                got.append(messages[j]["tool_call_id"])
                j += 1
            assert sorted(got) == sorted(ids), f"calls {ids} answered by {got} at {i}"
            i = j
        else:
            i += 1


# -- driving turns through a real store ---------------------------------------------------------------
async def store_turn(store: Any, mm: Any, session_id: str, user_id: str, text: str, answer: str,
                     calls: tuple[ToolCall, ...] = (), timestamp: str | None = None) -> tuple[Any, Any]:
    """What the turn runner does: store the user message, build the context, store the answer,
    then after_turn. Returns (context, assistant message)."""
    user = await store.append(session_id, "user", text, timestamp=timestamp)
    ctx = await mm.build_context(session_id, user_id, user, "chat-model")
    msg = await store.append(session_id, "assistant", answer, tool_calls=list(calls), timestamp=timestamp)
    await mm.after_turn(session_id, user_id)
    return ctx, msg


CHATTER_EN = [
    "check disk usage on web{n}", "nginx error log on web{n} shows 502s again", "restart the worker pool on queue{n}",
    "what is the load average on db{n}", "the database replica lag on db{n} is {n} seconds",
    "memory on cache{n} is at {n}0 percent", "deploy build {n} to staging", "roll back release {n} on api{n}",
    "cron job {n} failed overnight", "certificate on edge{n} expires in {n} days", "swap usage on app{n} looks high",
    "list the top processes by cpu on batch{n}", "ping latency to region {n} is {n}ms", "uptime of bastion{n}?",
]
CHATTER_ZH = [
    "查看web{n}的磁盘使用率", "nginx日志里又有502错误，服务器web{n}", "重启队列{n}的工作进程", "数据库{n}的负载是多少",
    "缓存{n}的内存占用到了百分之{n}0", "把版本{n}部署到测试环境", "回滚api{n}上的发布{n}", "定时任务{n}昨晚失败了",
    "边缘节点{n}的证书还有{n}天过期", "app{n}的交换分区使用偏高", "列出批处理机{n}上CPU最高的进程", "到区域{n}的延迟是{n}毫秒",
]


def chatter(rng: random.Random, templates: list[str]) -> str:
    return rng.choice(templates).format(n=rng.randint(1, 99))


class EmbeddingServer:
    """A minimal OpenAI-compatible ``POST /v1/embeddings`` server on 127.0.0.1:0 (asyncio streams).

    Vectors are bags of concepts: words of one synonym group share a dimension, other words hash
    into the remaining ones -- enough to find "automobile" from "car" where BM25 cannot.
    ``fail = True`` makes every request answer 500.
    """
    GROUPS = [{"car", "automobile", "vehicle", "汽车", "车"}, {"dog", "puppy", "hound"},
              {"invoice", "bill", "receipt"}]
    DIM = 64

    def __init__(self) -> None:
        self.requests = 0
        self.fail = False
        self._server: asyncio.AbstractServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def vector(self, text: str) -> list[float]:
        import re
        v = [0.0] * self.DIM
        for w in re.findall(r"\w+", text.lower()):
            dim = next((i for i, g in enumerate(self.GROUPS) if w in g), None)
            v[dim if dim is not None else len(self.GROUPS) + sum(map(ord, w)) % (self.DIM - len(self.GROUPS))] += 1
        return v

    async def __aenter__(self) -> "EmbeddingServer":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import json
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
                self.requests += 1
                if self.fail:
                    status, obj = "500 Internal Server Error", {"error": {"message": "down"}}
                else:
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    status, obj = "200 OK", {"object": "list", "model": body.get("model"), "data": [
                        {"object": "embedding", "index": i, "embedding": self.vector(t)} for i, t in enumerate(inputs)],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1}}
                data = json.dumps(obj).encode()
                writer.write(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                             f"content-length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def changes_on_another_node(store: Any, store_b: Any, user: str = "ops") -> None:
    """Two memory managers stand for two nodes (``store_b``: node b's store, the same one or another
    on the same database): node b searched the user's sessions before node a edited one,
    regenerated an answer in another and ran a turn in a third; b's next search finds none of the
    replaced text and every new turn (nothing told b about them)."""
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}})
    node_a, node_b = MemoryManager(cfg, store, None, None, "SYS"), MemoryManager(cfg, store_b, None, None, "SYS")
    edited = (await store.create(user, "edited")).session_id
    regenerated = (await store.create(user, "regenerated")).session_id
    await store_turn(store, node_a, edited, user, "the vault token is hvs-oops-pasted", "noted")
    await store_turn(store, node_a, edited, user, "check the vault status", "sealed: false")
    await store_turn(store, node_a, regenerated, user, "which port does grafana use?", "grafana uses port 9999")
    quiet = (await store.create(user, "quiet")).session_id
    await store_turn(store, node_a, quiet, user, "the ntp server is ntp-3", "ok")
    assert [h["session_id"] for h in await node_b.search(user, "vault token hvs")][:1] == [edited]
    assert [h["session_id"] for h in await node_b.search(user, "grafana port 9999")][:1] == [regenerated]

    await node_a.before_supersede(edited, user, await store.messages(edited))      # node a: the edit
    await supersede(store, edited, await store.messages(edited))    # (what the edit handler stores)
    node_a.forget_session(edited)
    await store_turn(store, node_a, edited, user, "the vault address is vault.internal", "noted")
    last = (await store.messages(edited))[-2]
    await store.update(edited, ChatMessage(last.id, last.role, last.content, last.timestamp, [], {"edited_from": 1}))
    await supersede(store, regenerated, await store.messages(regenerated, after_id=1))   # node a: the regenerate
    node_a.forget_session(regenerated)
    await store.append(regenerated, "assistant", "grafana listens on port 3000")
    third = (await store.create(user, "third")).session_id                          # node a: a new session
    await store.rename(quiet, "time servers")                                       # node a: a rename
    await store_turn(store, node_a, third, user, "the kafka brokers run on kafka-7", "ok")

    snippets = [h["snippet"] for q in ("vault token hvs oops pasted", "grafana port 9999", "vault address")
                for h in await node_b.search(user, q)]
    assert not [t for t in snippets if "hvs-oops" in t or "9999" in t]            # replaced text: gone on b too
    assert "the vault address is vault.internal / noted" in snippets
    assert "which port does grafana use? / grafana listens on port 3000" in snippets
    assert [h["session_id"] for h in await node_b.search(user, "kafka brokers")] == [third]
    assert [h["title"] for h in await node_b.search(user, "ntp server")] == ["time servers"]
    await node_a.aclose()
    await node_b.aclose()


# -- long pasted-log sessions (what a long message costs the event loop) ---------------------------
PASTE_WORDS = ("nginx postgres restart timeout backup disk latency deploy rollback kafka redis error warn "
               "服务器 数据库 备份 超时 重启 日志 磁盘").split()
PASTER = "paster"


def paste(rng: random.Random, n: int) -> str:
    """``n`` characters of pasted log (``PASTE_WORDS``)."""
    from testkit.pastes import paste as pasted
    return pasted(rng, n, PASTE_WORDS)


async def long_session(store: Any, turns: int, chars: int, seed: int = 1, user: str = PASTER) -> str:
    """A session of ``turns`` turns whose user messages are ``chars`` characters of pasted log."""
    rng = random.Random(seed)
    sid = (await store.create(user)).session_id
    for i in range(turns):
        await store.append(sid, "user", f"turn{i} " + paste(rng, chars))
        await store.append(sid, "assistant", f"answer{i} " + paste(rng, 300))
    return sid


def quiet_manager(store: Any) -> MemoryManager:
    """A MemoryManager without summaries or long-term memory (only the view and recall)."""
    cfg = MemoryConfig.from_dict({"summarization": {"enabled": False}, "user_memory": {"enabled": False}})
    return MemoryManager(cfg, store, OfflineStub(), None, "SYS")


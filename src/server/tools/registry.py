"""ToolRegistry: the read-only tools, their JSON schemas, and ``run`` which never raises.

Every outcome becomes a ToolCall: ``success`` with a compact JSON result, ``error`` with a precise
message the model can act on (unknown tool, malformed JSON, schema violation, refused target), or
``timeout``. Blocking work runs in the tools' own threads (``ToolThreads``, ``[tools] worker_threads``),
never in asyncio's default executor: a call that overruns its timeout keeps its thread busy until it
ends, and must not take one from the storage or the knowledge base. Results are scrubbed of secret
values. ``protected`` (built by ``server.wiring.protected_paths``) is the server's own data, which the
file and log tools never read even when a root holds it; a root that does is reported by one warning
when the registry is built.
"""
from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
import queue
import threading
import time
import uuid
import weakref
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, TypeVar

import psutil

from server.tools import files, logs, netcheck, offer, system
from server.tools import search as file_search
from server.tools.config import ToolsConfig
from server.tools.knowledge import DESCRIPTION as SEARCH_KNOWLEDGE_DESCRIPTION
from server.tools.knowledge import SEARCH_KNOWLEDGE_SCHEMA, KnowledgeSource, search_knowledge
from server.tools.paths import Protected, protected_overlaps
from server.tools.schema import ArgumentError, lenient_arguments, parse_arguments, validate
from server.tools.secrets import redact
from server.tools.units import ToolFailure, fit_json, to_json
from storage.models import ToolCall

log = logging.getLogger(__name__)
T = TypeVar("T")

SearchFn = Callable[..., Awaitable[list[Any]]]
MemoryItemsFn = Callable[[str], Awaitable["list[Any] | None"]]   # user id -> their items, oldest first

HISTORY_SEARCH_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 200,
                  "description": "Words to look for in the user's earlier conversations."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5,
                  "description": "Maximum number of hits."},
        "current_session_only": {"type": "boolean", "default": False,
                                 "description": "Search only the current conversation."},
    },
    "required": ["query"],
    "additionalProperties": False,
}

USER_MEMORY_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
MAX_MEMORY_ITEMS = 50       # newest first: the most a user_memory answer lists

DESCRIPTIONS = {
    "sys_monitor": "Live system metrics of the server machine: CPU (total and per core), memory and swap, "
                   "disk usage of every mounted filesystem, network I/O and interfaces, load average, uptime.",
    "processes": "Top processes by CPU or memory (pid, name, user, cpu percent, resident memory), "
                 "optionally filtered by name.",
    "network_check": "Resolve a host and test a TCP connection to host:port (only hosts allowed by the server).",
    "read_log": "Read the last lines of a log file under the server's allowed log directories.",
    "history_search": "Search this user's earlier conversations for a topic; returns matching snippets.",
    "clock": "Current date and time of the server, with its timezone and UTC.",
    "list_dir": "List a directory under the server's allowed file directories: name, type, size, modified time. "
                "Read-only; secret-looking files are hidden.",
    "read_file": "Read lines of a text file under the server's allowed file and log directories (binary files and "
                 "secret files are refused; long files are paged with offset).",
    "search_files": "Search text files under the server's allowed file and log directories for a string or RE2 regular "
                    "expression (like grep): returns matching lines with file and line number.",
    "search_knowledge": SEARCH_KNOWLEDGE_DESCRIPTION,
    "offer_download": offer.DESCRIPTION,
    "user_memory": "Everything the assistant remembers about this user from their conversations (durable "
                   "facts and preferences, newest first, each with its source session and time). Use it when "
                   "the user asks what you remember or know about them.",
}

SNIPPET_CHARS = 300
FILE_TOOLS = ("list_dir", "read_file", "search_files")   # the tools of tools.file_roots
OFF_LOOP_REDACT_CHARS = 32 * 1024


class ToolThreads(Executor):
    """The tools' blocking work: at most ``size`` daemon threads, started when needed, fed in order.

    A tool call that overruns its timeout is abandoned by the event loop but its thread runs on until the
    function returns (a thread cannot be stopped): here it holds one of the tools' threads, never one of
    asyncio's default executor (storage, knowledge ingest, uploads), so a runaway call cannot starve the
    rest of the server. Daemon threads: neither ``shutdown`` nor the interpreter's exit waits for them (a
    ThreadPoolExecutor's threads are joined at exit, so one stuck call kept the server from stopping).
    """

    def __init__(self, size: int, name: str = "nplt-tool") -> None:
        self._size, self._name = size, name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)      # released by a thread each time it waits for a job
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        # forgotten without shutdown (a registry of a test): its idle threads end
        weakref.finalize(self, _stop_threads, self._jobs, size)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the tool threads are shut down")
            self._jobs.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
                t = threading.Thread(target=_work, args=(self._jobs, self._idle), daemon=True,
                                     name=f"{self._name}-{len(self._threads)}")
                t.start()
                self._threads.append(t)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more jobs; idle threads end, busy ones when their call returns. ``cancel_futures``: the
        queued jobs are cancelled (else they run first); ``wait``: join the threads (a stuck one too)."""
        with self._lock:
            self._closed = True
            while cancel_futures:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            _stop_threads(self._jobs, len(self._threads))
        if wait:
            for t in self._threads:
                t.join()

    @property
    def started(self) -> int:
        """Threads started so far (at most ``size``)."""
        return len(self._threads)


def _stop_threads(jobs: queue.SimpleQueue[Any], count: int) -> None:
    for _ in range(count):
        jobs.put(None)


def _work(jobs: queue.SimpleQueue[Any], idle: threading.Semaphore) -> None:
    """One tool thread (holds no reference to its ToolThreads, so that it can be collected)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        future, fn, args, kwargs = job
        del job
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:
                future.set_exception(e)
        del future, fn, args, kwargs
        idle.release()


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who a tool runs for (history_search is scoped to this user)."""
    user_id: str
    session_id: str | None = None


@dataclass(slots=True)
class Tool:
    name: str
    schema: dict[str, Any]
    handler: Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
    timeout_s: float


class ToolRegistry:
    """The tools offered to agents. ``search`` is ``async search(user_id, query, session_id=None, k=5)``."""

    def __init__(self, config: ToolsConfig | None = None, *, search: SearchFn | None = None,
                 secrets: tuple[str, ...] = (), knowledge: KnowledgeSource | None = None,
                 offers: offer.OfferFn | None = None, memory_items: MemoryItemsFn | None = None,
                 protected: Iterable[Protected] = ()) -> None:
        self.config = config or ToolsConfig()
        self.protected = tuple(protected)   # the server's own data: no file or log tool reads it
        self.search = search
        self.memory_items = memory_items   # the user's long-term memory (None from it: turned off)
        self.knowledge = knowledge      # search_knowledge is offered only with a knowledge base
        self.offers = offers
        self._secrets = tuple(secrets)
        self._policy = netcheck.HostPolicy(self.config.allowed_hosts)
        self.threads = ToolThreads(self.config.worker_threads)
        cfg = self.config
        self._tools: dict[str, Tool] = {}
        self._add("sys_monitor", system.SYS_MONITOR_SCHEMA, self._sys_monitor, cfg.timeout_s)
        procs = copy.deepcopy(system.PROCESSES_SCHEMA)
        procs["properties"]["limit"]["maximum"] = cfg.max_processes
        self._add("processes", procs, self._processes, cfg.timeout_s)
        net = copy.deepcopy(netcheck.NETWORK_CHECK_SCHEMA)
        net["properties"]["timeout"]["maximum"] = cfg.max_network_timeout_s
        net["properties"]["timeout"]["description"] = f"Connect timeout in seconds (default {cfg.network_timeout_s:g})."
        # DNS and connect each get the timeout; leave headroom for both.
        self._add("network_check", net, self._network_check, 2 * cfg.max_network_timeout_s + 1)
        rl = copy.deepcopy(logs.READ_LOG_SCHEMA)
        rl["properties"]["lines"]["maximum"] = cfg.max_log_lines
        rl["properties"]["lines"]["default"] = min(50, cfg.max_log_lines)
        self._add("read_log", rl, self._read_log, cfg.timeout_s)
        ld = copy.deepcopy(files.LIST_DIR_SCHEMA)
        ld["properties"]["limit"]["maximum"] = cfg.max_list_entries
        ld["properties"]["limit"]["default"] = min(100, cfg.max_list_entries)
        self._add("list_dir", ld, self._list_dir, cfg.timeout_s)
        rf = copy.deepcopy(files.READ_FILE_SCHEMA)
        rf["properties"]["lines"]["maximum"] = cfg.max_read_lines
        rf["properties"]["lines"]["default"] = min(200, cfg.max_read_lines)
        self._add("read_file", rf, self._read_file, cfg.timeout_s)
        sf = copy.deepcopy(file_search.SEARCH_FILES_SCHEMA)
        sf["properties"]["limit"]["maximum"] = cfg.max_search_matches
        sf["properties"]["limit"]["default"] = min(50, cfg.max_search_matches)
        self._add("search_files", sf, self._search_files, cfg.timeout_s)
        self._add("history_search", HISTORY_SEARCH_SCHEMA, self._history_search, cfg.timeout_s)
        self._add("clock", system.CLOCK_SCHEMA, self._clock, cfg.timeout_s)
        if knowledge is not None:
            self._add("search_knowledge", SEARCH_KNOWLEDGE_SCHEMA, self._search_knowledge, cfg.timeout_s)
        if offers is not None:
            self._add("offer_download", offer.OFFER_DOWNLOAD_SCHEMA, self._offer_download, cfg.timeout_s)
        if memory_items is not None:
            self._add("user_memory", USER_MEMORY_SCHEMA, self._user_memory, cfg.timeout_s)
        psutil.cpu_percent(interval=None)   # prime psutil's counters once
        self._warn_protected_overlaps()
        for phrase in cfg.unusable_roots():     # (a typo such as /var/lgo: the server still starts)
            log.warning("%s: the tools will find nothing there until it is a readable directory (a typo?)", phrase)

    def _warn_protected_overlaps(self) -> None:
        """One warning when a file or log root holds the server's own data: it stays unreadable (the
        server still starts: a parent such as /home/ops is a legitimate root)."""
        overlaps = protected_overlaps({"tools.file_roots": self.config.file_roots,
                                       "tools.log_roots": self.config.log_roots}, self.protected)
        if overlaps:
            log.warning("the tools never read the server's own data, so these parts of the configured roots "
                        "are left out (refused when asked for, skipped in listings and searches): %s",
                        "; ".join(overlaps))

    def close(self) -> None:
        """Stop the tools' threads: queued calls are cancelled, a running one is not waited for."""
        self.threads.shutdown(wait=False, cancel_futures=True)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the tools' threads (as ``asyncio.to_thread``, with this context)."""
        ctx = contextvars.copy_context()
        try:
            job = asyncio.get_running_loop().run_in_executor(self.threads, ctx.run, fn, *args)
        except RuntimeError:                 # after close()
            raise ToolFailure("the server is shutting down") from None
        try:
            return await job
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if job.cancelled() and task is not None and not task.cancelling():   # by close(), not our caller
                raise ToolFailure("the server is shutting down") from None
            raise

    def _add(self, name: str, schema: dict[str, Any], handler: Callable[..., Awaitable[Any]], timeout: float) -> None:
        self._tools[name] = Tool(name, schema, handler, timeout)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def add_secret(self, value: str | None) -> None:
        """Register one more value that must never appear in tool output (e.g. the LLM API key)."""
        if value:
            self._secrets = (*self._secrets, value)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` parameter."""
        return [{"type": "function", "function": {"name": t.name, "description": DESCRIPTIONS[t.name],
                                                  "parameters": t.schema}} for t in self._tools.values()]

    @property
    def disabled(self) -> frozenset[str]:
        """The registered tools the configuration turns off, never offered to a model: read_log without
        ``tools.log_roots``, list_dir, read_file and search_files without ``tools.file_roots`` (they
        only answer "disabled"; the offline agent still runs them to say so)."""
        off = set()
        if not self.config.log_roots:
            off.add("read_log")
        if not self.config.file_roots:
            off.update(FILE_TOOLS)
        return frozenset(off)

    async def schemas_for(self, user_id: str) -> list[dict[str, Any]]:
        """``schemas()`` for one user: without the ``disabled`` tools, and ``search_knowledge`` only
        when the user can see a document."""
        off = self.disabled
        tools = [t for t in self.schemas() if t["function"]["name"] not in off]
        if self.knowledge is not None and not await self.knowledge.has_documents(user_id):
            tools = [t for t in tools if t["function"]["name"] != "search_knowledge"]
        return tools

    async def offered(self, user_id: str) -> list[str]:
        """The names of the tools ``schemas_for(user_id)`` offers (without search_knowledge if that
        cannot be told)."""
        try:
            return [t["function"]["name"] for t in await self.schemas_for(user_id)]
        except Exception as e:
            log.warning("could not tell which tools are offered: %s", type(e).__name__)
            off = self.disabled
            return [n for n in self._tools if n != "search_knowledge" and n not in off]

    @staticmethod
    def unknown_tool(name: str, offered: Iterable[str]) -> str:
        """The error of a call to a tool that is not offered (not registered, or not offered to this
        user in this turn): it names only the ``offered`` tools."""
        return f"unknown tool '{name}' (available: {', '.join(offered)})"

    def pending(self, name: str, arguments: str | dict | None, call_id: str | None = None,
                step: int = 0) -> ToolCall:
        """The ``running`` ToolCall announced before a call executes."""
        return ToolCall(id=call_id or new_call_id(), tool_name=name, arguments=lenient_arguments(arguments),
                        result="", status="running", duration=0.0, step=step)

    async def run(self, name: str, arguments: str | dict | None, ctx: ToolContext, call_id: str | None = None,
                  step: int = 0, timeout: float | None = None) -> ToolCall:
        """Validate and run one tool call. Never raises (except CancelledError)."""
        call = self.pending(name, arguments, call_id, step)
        start = time.perf_counter()
        status, result = "success", ""
        tool = self._tools.get(name)
        try:
            if tool is None:   # name only what this user is offered (schemas_for)
                raise ArgumentError(self.unknown_tool(name, await self.offered(ctx.user_id)))
            args = validate(tool.schema, parse_arguments(arguments))
            call.arguments = args
            limit = tool.timeout_s if timeout is None else min(tool.timeout_s, timeout)
            try:
                async with asyncio.timeout(limit):
                    value = await tool.handler(args, ctx)
            except TimeoutError:
                status, result = "timeout", to_json({"error": f"tool '{name}' timed out after {limit:g} s"})
            else:
                result = to_json(value)
        except (ArgumentError, ToolFailure) as e:
            status, result = "error", to_json({"error": str(e)})
        except Exception as e:  # a bug or an unexpected OS error: report, never raise
            log.exception("tool %s failed", name)
            status, result = "error", to_json({"error": f"tool '{name}' failed: {type(e).__name__}"})
        if len(result) > OFF_LOOP_REDACT_CHARS:   # a long text: scrub it off the event loop
            call.result = await asyncio.to_thread(lambda: self._cap(redact(result, self._secrets)))
        else:
            call.result = self._cap(redact(result, self._secrets))
        call.status = status
        call.duration = round(time.perf_counter() - start, 6)
        return call

    def _cap(self, text: str) -> str:
        """At most ``max_result_chars``: texts (then lists) cut inside the JSON, marked (``fit_json``)."""
        return fit_json(text, self.config.max_result_chars)

    # -- handlers ----------------------------------------------------------------------------------

    async def _sys_monitor(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._in_thread(system.sys_monitor, self.config, args["metric"])

    async def _processes(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._in_thread(system.processes, self.config, args["sort_by"], args["limit"],
                                     args.get("name"))

    async def _network_check(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await netcheck.network_check(self.config, self._policy, args["host"], args["port"],
                                            args.get("timeout"))

    async def _read_log(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._in_thread(logs.read_log, self.config, args["path"], args["lines"], self.protected,
                                     self._secrets)

    async def _list_dir(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._in_thread(files.list_dir, self.config, args["path"], args.get("pattern"), args["limit"],
                                     self.protected)

    async def _read_file(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._in_thread(files.read_file, self.config, args["path"], args["offset"], args["lines"],
                                     self.protected, self._secrets)

    async def _search_files(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._in_thread(file_search.search_files, self.config, args["root"], args["pattern"],
                                     args["regex"], args["ignore_case"], args["limit"], self.protected,
                                     self._secrets)

    async def _search_knowledge(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await search_knowledge(self.knowledge, args, ctx.user_id)

    async def _clock(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return system.clock()

    async def _offer_download(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await offer.offer_download(self.offers, args, ctx.user_id, ctx.session_id)

    async def _user_memory(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """This user's remembered items only (``ctx.user_id``), newest first."""
        assert self.memory_items is not None
        items = await self.memory_items(ctx.user_id)
        if items is None:
            return {"enabled": False, "count": 0, "items": []}
        newest = list(reversed(items))[:MAX_MEMORY_ITEMS]
        return {"enabled": True, "count": len(items),
                "items": [{"kind": i.kind, "text": i.text, "session_id": i.session_id, "created_at": i.created_at}
                          for i in newest]}

    async def _history_search(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        if self.search is None:
            raise ToolFailure("history search is unavailable on this server")
        session = ctx.session_id if args["current_session_only"] else None
        try:
            hits = await self.search(ctx.user_id, args["query"], session_id=session, k=args["limit"])
        except Exception as e:
            log.warning("history search failed: %s", type(e).__name__)
            raise ToolFailure(f"history search failed ({type(e).__name__})") from None
        out = []
        for hit in list(hits)[: args["limit"]]:
            d = hit.to_dict() if hasattr(hit, "to_dict") else dict(hit)
            for key in ("snippet", "content", "text"):
                if isinstance(d.get(key), str) and len(d[key]) > SNIPPET_CHARS:
                    d[key] = d[key][:SNIPPET_CHARS] + "…"
            out.append(d)
        return {"query": args["query"], "scope": "session" if session else "all", "hits": out}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:16]


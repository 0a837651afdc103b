"""OfflineAgent: the deterministic default when no language model is configured.

It recognizes a fixed set of Chinese and English requests (server.agent.intents), runs the same
tools through the same registry with the same sink events and ToolCall records as the LLM agent,
and streams a concise answer written from the real results (server.agent.answers) in the user's
language. No network, no model: everything it says about the machine comes from a tool.

A question holding a live reading against the documents ("is the disk above the threshold in the
runbook?"; ``knowledge_route.mixed_readings``) runs the reading with the document search and answers
with the passages quoted, the reading and the comparison of both (``knowledge_answer.compare_readings``).

Its answer to a history question (a listing of earlier messages) is marked ``"history_listing": true``
in the message metadata: the recall index leaves that turn out (``server.memory.recall.turn_docs``), so
the same question asked again finds what the user said, not the earlier listings.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from server.agent import answers, intents, knowledge_answer, knowledge_route, memory_answers
from server.agent.base import TurnRequest, TurnResult, TurnSink
from server.agent.config import AgentConfig
from server.agent.toolexec import CallRequest, run_tool_step
from server.tools import ToolContext, ToolRegistry

OFFLINE_MODEL = "offline"
log = logging.getLogger(__name__)


class OfflineAgent:
    """A real, useful agent without an LLM. ``models() == ["offline"]``."""

    name = "offline"
    offline = True
    default_model = OFFLINE_MODEL

    def __init__(self, agent: AgentConfig, tools: ToolRegistry) -> None:
        self.cfg = agent
        self.registry = tools

    def __repr__(self) -> str:
        return "OfflineAgent()"

    def models(self) -> list[str]:
        return [OFFLINE_MODEL]

    async def aclose(self) -> None:
        self.registry.close()          # the tools' threads: queued calls cancelled, none waited for

    async def tool_schema_tokens(self, user_id: str) -> int:
        """No model request, so no tool schemas to reserve room for."""
        return 0

    async def complete(self, messages: list[dict[str, Any]], model: str | None = None) -> str:
        """No model to summarize with: "" tells the memory layer to use its extractive summarizer."""
        return ""

    async def run_turn(self, req: TurnRequest, sink: TurnSink) -> TurnResult:
        text = req.user_message.content
        zh = intents.is_chinese(text)
        await sink.status("thinking")
        found = intents.parse(text, req.context.messages)        # (the turn's messages: pronouns, re-sorts)
        calls = []
        known = self.registry.names
        memory_off = "user_memory" not in known          # long-term memory turned off (or no memory layer)
        asked_memory = memory_off and any(i.tool == "user_memory" for i in found)
        found = [i for i in found if not i.tool or i.tool in known]
        tool_intents = [i for i in found if i.tool]
        canned_first = [i for i in found if i.name in ("refuse", "log_path", "unsupported", "which_file")]   # before memory and documents
        noted = [] if canned_first else knowledge_route.statement_items(text)
        if any(kind == "forget" for kind, _ in noted):
            tool_intents = []       # a request to forget asks no tool ("Forget what I said about the DB host")
        elif tool_intents:
            noted = []
        recalled = None if tool_intents or noted or canned_first else \
            await memory_answers.answer_async(text, req.context.messages, zh)
        source = getattr(self.registry, "knowledge", None)
        if canned_first:           # a request to act (the tools are read-only), a log asked for by no path
            route = knowledge_route.Route("general", "intent", f"{canned_first[0].name}: answered without a tool")
        else:
            route = await knowledge_route.decide(text, req.context.messages, source, req.user_id,
                                                 [i.name for i in tool_intents], stated=bool(noted),
                                                 remembered=recalled is not None)
        req.context.metadata["route"] = route.record()
        citations: list[dict[str, Any]] = []
        if route.route == "knowledge":
            # a reading asked against the documents ("is the disk above the threshold in the runbook?"):
            # the reading is taken with the search, in the same step
            reading = [i for i in tool_intents if i.name in route.readings and i.tool]
            calls = await run_tool_step(self.registry, sink, [CallRequest(None, "search_knowledge",
                                                                          {"query": route.query[:500], "top_k": 5}),
                                                              *(CallRequest(None, i.tool, i.arguments) for i in reading)],
                                        ToolContext(req.user_id, req.session_id), step=0, timeout=self.cfg.tool_timeout_s)
            uploaded = knowledge_answer.upload_times(calls[0])
            answer, citations = knowledge_answer.answer(calls[0], zh, route.focus, uploaded)
            found = [intents.Intent("knowledge", 1.0, "search_knowledge")]
            if reading:
                answer = "\n\n".join([answer, *(answers.render(c, zh) for c in calls[1:]),
                                       knowledge_answer.compare_readings(calls[0], citations, calls[1:], text,
                                                                         route.readings, zh)])
                found += reading
        elif tool_intents:
            requests = [CallRequest(None, i.tool, i.arguments) for i in tool_intents if i.tool]
            calls = await run_tool_step(self.registry, sink, requests, ToolContext(req.user_id, req.session_id),
                                        step=0, timeout=self.cfg.tool_timeout_s)
            roots = (self.registry.config.log_roots, self.registry.config.file_roots)
            answer = answers.tool_results([answers.render(c, zh) for c in calls], found, zh, roots)
            for i in (i for i in found if i.name == "note"):   # "show memory and remember that ...": after the readings
                part = str(i.arguments.get("part", ""))
                said = knowledge_route.statement_items(part)
                answer = "\n\n".join([answer, answers.noted(said, zh, kept=not memory_off) if said else
                                       answers.NOTES_AFTER["part_not_answered"][zh].format(part=part)])
        elif noted:                # what the user memory keeps or forgets; without it, nothing is kept beyond this session
            forgotten = None if memory_off else await self._forgotten(req.user_id, noted)
            answer = answers.noted(noted, zh, kept=not memory_off, forgotten=forgotten)
            kinds = {kind for kind, _ in noted}                      # fact, preference, no longer, forget
            found = [intents.Intent("note", 1.0)] if kinds - {"forget"} else []
            if "forget" in kinds:
                found.append(intents.Intent("forget", 1.0))
        elif recalled is not None:
            answer = recalled                                        # what the user said in other sessions
            found = [intents.Intent("memory", 1.0)]
        elif asked_memory:        # "what do you remember about me?" with long-term memory off
            answer = answers.memory_off(zh)
            found = [intents.Intent("remembered", 1.0)]
        elif found:   # help, a refusal to act, a log asked for by no path
            roots = (self.registry.config.log_roots, self.registry.config.file_roots)
            answer = answers.without_tool(found, zh, roots)
        elif knowledge_route.COURTESY.fullmatch(text.strip()):
            answer = answers.courtesy(zh)                            # thanks, "got it": not a failure
        else:
            answer = answers.not_understood(zh)
        await sink.status("generating")
        await self._stream(answer, sink)
        metadata: dict[str, Any] = {"model": OFFLINE_MODEL, "agent": self.name,
                                    "intents": [i.name for i in found] or ["unknown"]}
        if citations:
            metadata["citations"] = citations
        if not tool_intents and not calls and not noted and recalled is None:
            metadata["canned"] = True    # help or not understood: a fixed text, not about the user's topic
        if any(i.name == "history" for i in found):
            # a listing of earlier messages: searched or recalled, it would only find them again
            metadata["history_listing"] = True
        return TurnResult(content=answer, tool_calls=calls, usage={"llm_calls": 0}, finish_reason="stop",
                          metadata=metadata)

    async def _forgotten(self, user_id: str, noted: list[tuple[str, str]]) -> list[tuple[str, list[str]]] | None:
        """What the message's requests to forget remove from the user's memory (``memory_answers.forgotten``,
        from the items MEMORY_LIST shows; the user memory removes them before the TURN_END), or None
        when there is none or the items cannot be read."""
        items = getattr(self.registry, "memory_items", None)
        if items is None or not any(kind == "forget" for kind, _ in noted):
            return None
        try:
            mine = await items(user_id)
        except Exception:
            log.exception("reading the user memory of %s failed", user_id)
            return None
        return None if mine is None else memory_answers.forgotten(mine, noted)

    async def _stream(self, answer: str, sink: TurnSink) -> None:
        size = self.cfg.stream_chunk_chars
        for start in range(0, len(answer), size):
            await sink.delta(answer[start:start + size])
            await asyncio.sleep(0)   # a cancellation point between chunks

"""The general-vs-knowledge routing decision and the offline agent's knowledge answers.

Rule (offline agent), first match wins:
1. ``keyword``: the message mentions the documents (知识库, 文档, 资料, "knowledge base", "the docs",
   "my/the/our documents", "documentation") -> knowledge.
2. ``intent``: a system request the offline agent has a tool for (CPU, disk, logs, ...) -> general.
   ``statement``: the message only states facts or preferences to keep, as the user memory's rules
   read them ("remember that the staging host is stage-7", "以后用中文回答"; no question) -> general.
3. ``follow_up``: the previous answer quoted documents (the offline agent's documents answer, with a
   ``[name §location]`` citation; not, say, a history answer quoting one) and
   this message is short (at most 8 words, or 16 CJK characters) -> knowledge; the retrieval query
   is the previous question plus this one ("and its default?" finds the passage about the timeout),
   and the passages holding one of this message's own search terms are quoted first ("and its
   port?" quotes the port, not again the passage the previous answer quoted).
4. ``strong_match``: the best passage for the message holds at least 60% of the message's distinct
   search terms, and at least 2 of them -> knowledge.
5. otherwise general (``default``; ``no_documents`` when the user can see no document).

Every turn records ``{"route", "method", "reason", "query"?}`` in its context metadata (``route``).
The LLM agent decides by calling ``search_knowledge`` or not; ``record_model_route`` records that.
Passages are quoted (Markdown block quotes with their citation), never followed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.memory.analyze import analyze
from server.memory.distill import distill_rules
from server.memory.extractive import sentences

KEYWORDS = re.compile(r"知识库|文档|资料库|资料|\bknowledge[- ]?base\b|\bthe docs\b|\bmy docs\b|"
                      r"\b(?:my|the|our|uploaded)\s+(?:documents?|files)\b|\bdocumentation\b", re.IGNORECASE)
CITATION = re.compile(r"\[[^\[\]\n]+ §[^\[\]\n]+\]")
FOLLOW_UP_MAX_WORDS = 8
FOLLOW_UP_MAX_CJK = 16
STRONG_SHARE = 0.6
STRONG_MIN_TERMS = 2
QUOTE_TOP = 3
QUOTE_CHARS = 600
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
ANSWER_HEAD_EN, ANSWER_HEAD_ZH = "From your documents:", "知识库中的相关内容："


@dataclass(slots=True)
class Route:
    route: str             # "knowledge" | "general"
    method: str            # keyword | intent | follow_up | strong_match | default | no_documents | model...
    reason: str
    query: str = ""
    focus: str = ""        # follow_up: the new message, whose own terms pick among the passages found

    def record(self) -> dict[str, Any]:
        out = {"route": self.route, "method": self.method, "reason": self.reason}
        if self.query:
            out["query"] = self.query
        return out


def _previous(messages: list[dict[str, Any]], role: str) -> str | None:
    """The content of the last ``role`` message before the new (last) one."""
    for m in reversed(messages[:-1]):
        if m.get("role") == role and isinstance(m.get("content"), str):
            return m["content"]
    return None


def is_follow_up(text: str) -> bool:
    cjk = len(_CJK.findall(text))
    if cjk:
        return cjk <= FOLLOW_UP_MAX_CJK
    return len(text.split()) <= FOLLOW_UP_MAX_WORDS


def statement_items(text: str) -> list[tuple[str, str]]:
    """The facts and preferences the user memory keeps of the message (``distill_rules``: (kind,
    text)) when every sentence of it is one of them (nothing else asked), else []."""
    parts = sentences(text)
    items = distill_rules(text) if parts else []
    return items if len(items) == len(parts) else []


def coverage(query: str, passage: str) -> tuple[int, int]:
    """(query terms found in the passage, distinct query terms)."""
    terms = set(analyze(query))
    return covered(terms, passage), len(terms)


def covered(terms: set[str], passage: str) -> int:
    """How many of the (analyzed) search ``terms`` the passage holds."""
    return len(terms & set(analyze(passage)))


async def decide(text: str, messages: list[dict[str, Any]], source: Any, user_id: str,
                 tool_intents: list[str], *, stated: bool = False) -> Route:
    """The offline agent's route for one message (see the module doc for the rule); ``stated``: the
    message only states facts or preferences (``statement_items``)."""
    if source is None:
        return Route("general", "no_knowledge_base", "this server has no knowledge base")
    if not await source.has_documents(user_id):
        return Route("general", "no_documents", "the user can see no document")
    m = KEYWORDS.search(text)
    if m:
        return Route("knowledge", "keyword", f"the message mentions {m.group(0)!r}", text)
    if tool_intents:
        return Route("general", "intent", f"a system request: {', '.join(tool_intents)}")
    if stated:
        return Route("general", "statement", "the message states facts or preferences to keep, asks nothing")
    prev_answer = _previous(messages, "assistant")
    prev_question = _previous(messages, "user")
    if prev_answer and prev_answer.startswith((ANSWER_HEAD_EN, ANSWER_HEAD_ZH)) and CITATION.search(prev_answer) \
            and prev_question and is_follow_up(text):
        return Route("knowledge", "follow_up", "a short follow-up to an answer from the documents",
                     f"{prev_question} {text}", text)
    hits = await source.search(user_id, text, 1)
    if hits:
        found, total = coverage(text, hits[0].text + " " + " ".join(hits[0].location.get("heading", [])))
        if found >= STRONG_MIN_TERMS and found >= STRONG_SHARE * total:
            return Route("knowledge", "strong_match",
                         f"{hits[0].citation} holds {found} of the message's {total} search terms", text)
    return Route("general", "default", "no document mention and no strong match")


def passages_of(call: Any) -> list[dict[str, Any]]:
    """The passages of a successful search_knowledge ToolCall."""
    if call.tool_name != "search_knowledge" or call.status != "success":
        return []
    try:
        doc = json.loads(call.result)
    except ValueError:
        return []
    return [p for p in doc.get("passages", []) if isinstance(p, dict)] if isinstance(doc, dict) else []


def cite(p: dict[str, Any]) -> dict[str, Any]:
    return {k: p.get(k) for k in ("citation", "doc_id", "name", "chunk_id", "location")}


def answer(call: Any, zh: bool, focus: str = "") -> tuple[str, list[dict[str, Any]]]:
    """The offline answer quoting the best passages, and the citations it carries. ``focus`` (a
    follow-up's own words, searched together with the previous question): the passages holding one
    of its search terms come first ("and its port?" quotes the passage about the port, not the one
    the previous answer quoted again); none holding one: the ranking as it is."""
    found = passages_of(call)
    if not found:
        if call.status != "success":
            return ("知识库检索失败。" if zh else "The document search failed."), []
        return ("知识库里没有找到相关内容。" if zh else "I found nothing about that in your documents."), []
    terms = set(analyze(focus)) if focus else set()
    if terms:
        on_focus = [p for p in found if covered(terms, str(p.get("text", "")) + " " + str(p.get("citation", "")))]
        found = on_focus or found
    best = found[0].get("score") or 0
    quoted = [p for p in found[:QUOTE_TOP] if (p.get("score") or 0) >= 0.5 * best] or found[:1]
    parts = [ANSWER_HEAD_ZH if zh else ANSWER_HEAD_EN]
    for p in quoted:
        text = str(p.get("text", ""))
        if len(text) > QUOTE_CHARS:
            text = text[:QUOTE_CHARS] + "…"
        block = "\n".join("> " + line if line.strip() else ">" for line in text.splitlines())
        parts.append(f"{block}\n\n— {p.get('citation', '')}")
    return "\n\n".join(parts), [cite(p) for p in quoted]


def record_model_route(context: dict[str, Any], metadata: dict[str, Any], calls: list[Any], content: str) -> None:
    """The LLM agent's route (did it search the documents?) and the citations its answer uses."""
    found = [p for c in calls for p in passages_of(c)]
    if any(c.tool_name == "search_knowledge" for c in calls):
        context["route"] = Route("knowledge", "model_tool_call", "the model called search_knowledge").record()
    else:
        context["route"] = Route("general", "model", "the model answered without searching the documents").record()
    if found:
        used = [p for p in found if p.get("citation") and p["citation"] in content] or found
        seen: set[Any] = set()
        metadata["citations"] = [cite(p) for p in used if not (p.get("chunk_id") in seen or seen.add(p.get("chunk_id")))]

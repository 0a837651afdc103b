"""The general-vs-knowledge routing decision and the offline agent's knowledge answers.

Rule (offline agent), first match wins:
1. ``keyword``: the message mentions the documents (知识库, 文档, 资料, "knowledge base", "the docs",
   "my/the/our documents", "documentation") -> knowledge. The words that route it ("according to my
   documents", "does the documentation say", "文档里有没有写"; ``ROUTING``) are left out of the search:
   they say where to look, not what to look for.
2. ``intent``: a system request the offline agent has a tool for (CPU, disk, logs, ...) -> general.
   ``statement``: the message only states facts or preferences to keep, as the user memory's rules
   read them ("remember that the staging host is stage-7", "以后用中文回答"; no question) -> general.
3. ``follow_up``: the previous answer quoted documents (the offline agent's documents answer, with a
   ``[name §location]`` citation; not, say, a history answer quoting one), this message is short (at
   most 8 words, or 16 CJK characters), is no thanks or greeting, is not answered by what the user
   told the assistant (their long-term memory), and refers back ("and its port?", "那它的端口呢";
   ``REFERS_BACK``) or shares a search term with the passages the previous answer quoted -> knowledge;
   the retrieval query is the previous question plus this one ("and its default?" finds the passage
   about the timeout), and only the passages holding one of this message's own search terms are
   quoted ("and its port?" quotes the port, not again the passage the previous answer quoted; a
   message with no search term of its own, "tell me more", goes by the previous question's).
4. ``strong_match``: the best passage for the message holds at least 60% of the message's distinct
   search terms, and at least 2 of them -> knowledge.
5. otherwise general (``default``; ``no_documents`` when the user can see no document).

A knowledge answer quotes only passages that hold at least one search term of the question
(``search_terms``: no stopword, no word naming the documents); when none does, it says the documents
have nothing about it.

Every turn records ``{"route", "method", "reason", "query"?}`` in its context metadata (``route``).
The LLM agent decides by calling ``search_knowledge`` or not; ``record_model_route`` records that.
Passages are quoted (Markdown block quotes with their citation), never followed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.memory.analyze import CJK_STOP_CHARS, analyze
from server.memory.distill import MAX_ITEMS_PER_MESSAGE, distill_rules
from server.memory.extractive import sentences

KEYWORDS = re.compile(r"知识库|文档|资料库|资料|\bknowledge[- ]?base\b|\bthe docs\b|\bmy docs\b|"
                      r"\b(?:my|the|our|uploaded)\s+(?:documents?|files)\b|\bdocumentation\b",
                      re.IGNORECASE | re.ASCII)   # (ASCII \b: "documentation里" has none in Unicode)
_OWNER = r"(?:(?:my|the|our|your|uploaded|all)\s+)"
#: the routing phrase with the words around it that only say "look in the documents" (left out of the search)
ROUTING = re.compile(
    r"(?:\b(?:according\s+to|based\s+on|as\s+per|from|in|inside|within|search(?:ing)?|check(?:ing)?|"
    r"look(?:ing)?\s+(?:in|into|through|at)|(?:what\s+)?(?:does|do|did|will|would|can|could)|"
    r"is\s+(?:there\s+)?(?:anything\s+)?in)\s+)?"
    rf"(?:{_OWNER}*(?:\bknowledge[- ]?base|\bdocs|\bdocumentation)|{_OWNER}+(?:documents?|files))\b"
    r"(?:\s+(?:say|says|said|mention|mentions|tell\s+(?:me|us)|cover|covers|contain|contains|include|includes|"
    r"have|has|list|lists|describe|describes|explain|explains|state|states|show|shows)\b)?"
    r"(?:\s+(?:about|for|on|regarding|whether|if)\b)?|"
    r"(?:请)?(?:帮我)?(?:根据|按照|依据|参考|查一下|查查|查询|查看|搜索|搜一下|查找|看看|在|从)?(?:我的|我们的|上传的)?"
    r"(?:知识库|文档|资料库|资料)(?:里面|里|中|内|上)?(?:的)?(?:有没有|是否|有)?(?:写|提到|说|讲|记载|介绍|提|说明)?"
    r"(?:过|了|到)?(?:关于)?", re.IGNORECASE | re.ASCII)
#: terms of the words that name the documents: never what a question is about
ROUTING_TERMS = frozenset(analyze("documents documentation docs knowledge base knowledgebase")) | {
    "文档", "知识", "识库", "资料", "料库"}
#: words that only ask ("tell me more", "explain"): never what a question is about either
ASKING_TERMS = frozenset(analyze("tell say said explain describe know mention please thanks thank detail details"))
#: a short message that refers back to the previous answer ("and its port?", "那它的端口呢", "tell me more")
REFERS_BACK = re.compile(
    r"^\W*(?:and|also|plus|but|so|then|or)\b|\b(?:what|how)\s+about\b|"
    r"\b(?:it|its|it's|itself|that|this|these|those|they|them|their|there|same|one|ones|else|more|other|another)\b|"
    r"^\W*(?:那|那么|还有|另外|以及|而且|并且|然后|再)|它|其|这个|那个|这些|那些|同样|更多|其他|其它|别的|"
    r"呢\s*[？?。!！]*\s*$", re.IGNORECASE | re.ASCII)
#: thanks, greetings and acknowledgements: never a follow-up
COURTESY = re.compile(
    r"(?:(?:thanks?|thank\s+you|thx|ty|many\s+thanks|so\s+much|very\s+much|a\s+lot|again|ok(?:ay)?|cool|great|nice|"
    r"perfect|awesome|got\s+it|understood|i\s+see|that\s+helps|that's\s+helpful|helpful|hi|hello|hey|bye|goodbye|"
    r"good\s+(?:morning|afternoon|evening|night)|cheers|no\s+problem|谢谢|多谢|感谢|谢了|好的|好吧|好|嗯|行|收到|"
    r"明白|了解|知道了|懂了|你好|您好|再见|拜拜|辛苦了|没事了|没问题|不错|很好|太好了)"
    r"(?:你|您|啦|了|哈|呀|啊|哦|喔)*[\s,.!~，。！、]*)+", re.IGNORECASE | re.ASCII)
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
    focus: str = ""        # the text whose search terms a quoted passage must hold (follow_up: the new message)

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
    """Short enough to be a follow-up (at most ``FOLLOW_UP_MAX_WORDS`` words or ``FOLLOW_UP_MAX_CJK``
    CJK characters)."""
    cjk = len(_CJK.findall(text))
    if cjk:
        return cjk <= FOLLOW_UP_MAX_CJK
    return len(text.split()) <= FOLLOW_UP_MAX_WORDS


def search_query(text: str) -> str:
    """``text`` without the words that send it to the documents (``ROUTING``)."""
    return " ".join(ROUTING.sub(" ", text).split())


def search_terms(text: str) -> set[str]:
    """The search terms a passage must share with ``text`` to be about it: the analyzed terms of
    ``search_query(text)`` without those naming the documents or only asking ("tell", "explain");
    of CJK text only the character pairs with no function character (a single character, or "它的",
    says nothing on its own)."""
    out = set()
    for term in analyze(search_query(text)):
        if term in ROUTING_TERMS or term in ASKING_TERMS:
            continue
        if not _CJK.match(term) or (len(term) == 2 and not CJK_STOP_CHARS.intersection(term)):
            out.add(term)
    return out


def statement_items(text: str) -> list[tuple[str, str]]:
    """The facts and preferences the user memory keeps of the message (``distill_rules``: (kind,
    text)) when every sentence of it is one of them (nothing else asked), else []."""
    parts = sentences(text)
    if not parts or len(parts) > MAX_ITEMS_PER_MESSAGE:      # (more sentences than items are ever kept)
        return []
    items = distill_rules(text)
    return items if len(items) == len(parts) else []


def coverage(query: str, passage: str) -> tuple[int, int]:
    """(query terms found in the passage, distinct query terms)."""
    terms = set(analyze(query))
    return covered(terms, passage), len(terms)


def covered(terms: set[str], passage: str) -> int:
    """How many of the (analyzed) search ``terms`` the passage holds."""
    return len(terms & set(analyze(passage)))


def _refers_to(text: str, prev_answer: str) -> bool:
    """``text`` is a follow-up of the documents answer ``prev_answer``: it refers back to it, or shares a
    search term with the passages it quoted (a thanks or a greeting never is)."""
    if COURTESY.fullmatch(text.strip()):
        return False
    return REFERS_BACK.search(text) is not None or covered(search_terms(text), prev_answer) > 0


async def decide(text: str, messages: list[dict[str, Any]], source: Any, user_id: str,
                 tool_intents: list[str], *, stated: bool = False, remembered: bool = False) -> Route:
    """The offline agent's route for one message (see the module doc for the rule); ``stated``: the
    message only states facts or preferences (``statement_items``); ``remembered``: what the user told
    the assistant answers it (``memory_answers``), so it is no follow-up to the documents."""
    if source is None:
        return Route("general", "no_knowledge_base", "this server has no knowledge base")
    if not await source.has_documents(user_id):
        return Route("general", "no_documents", "the user can see no document")
    m = KEYWORDS.search(text)
    if m:
        return Route("knowledge", "keyword", f"the message mentions {m.group(0)!r}", search_query(text) or text, text)
    if tool_intents:
        return Route("general", "intent", f"a system request: {', '.join(tool_intents)}")
    if stated:
        return Route("general", "statement", "the message states facts or preferences to keep, asks nothing")
    prev_answer = _previous(messages, "assistant")
    prev_question = _previous(messages, "user")
    if prev_answer and prev_answer.startswith((ANSWER_HEAD_EN, ANSWER_HEAD_ZH)) and CITATION.search(prev_answer) \
            and prev_question and is_follow_up(text) and not remembered and _refers_to(text, prev_answer):
        query = search_query(f"{prev_question} {text}")
        return Route("knowledge", "follow_up", "a short follow-up to an answer from the documents", query,
                     text if search_terms(text) else query)
    hits = await source.search(user_id, text, 1)
    if hits:
        found, total = coverage(text, hits[0].text + " " + " ".join(hits[0].location.get("heading", [])))
        if found >= STRONG_MIN_TERMS and found >= STRONG_SHARE * total:
            return Route("knowledge", "strong_match",
                         f"{hits[0].citation} holds {found} of the message's {total} search terms", text, text)
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


def answer(call: Any, zh: bool, focus: str) -> tuple[str, list[dict[str, Any]]]:
    """The offline answer quoting the best passages, and the citations it carries. Only the passages
    holding one of ``focus``'s search terms (``search_terms``: the question's, or a follow-up's own)
    are quoted: "and its port?" quotes the passage about the port, not the one the previous answer
    quoted again, and a passage that merely says "this page documents ..." is not quoted for a
    question the documents do not answer. None holding one: the documents have nothing about it."""
    found = passages_of(call)
    if not found and call.status != "success":
        return ("知识库检索失败。" if zh else "The document search failed."), []
    terms = search_terms(focus)
    if not terms:
        return ("请告诉我要在知识库里查找什么。" if zh else "Tell me what to look for in your documents."), []
    found = [p for p in found if covered(terms, str(p.get("text", "")) + " " + str(p.get("citation", "")))]
    if not found:
        return ("知识库里没有找到相关内容。" if zh else "I found nothing about that in your documents."), []
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

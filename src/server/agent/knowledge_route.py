"""The general-vs-knowledge routing decision and the offline agent's knowledge answers.

Rule (offline agent), first match wins:
1. ``keyword``: the message mentions the documents (知识库, 文档, 资料, "knowledge base", "the docs",
   "my/the/our documents", "documentation") -> knowledge. The words that route it ("according to my
   documents", "does the documentation say", "文档里有没有写"; ``ROUTING``) are left out of the search:
   they say where to look, not what to look for.
2. ``intent``: a system request the offline agent has a tool for (CPU, disk, logs, ...) -> general,
   unless it is a question about a metric, the time or a port (``OUTRANKED``; no command such as
   "show ...", "check ...", "查看...": ``intents.COMMAND``) whose best passage holds what it asks beyond
   the machine (``match_terms(parsed_part(text), request=True)``: without the words that made it a
   system request nor the machine the reading is taken on, "web-01", "the web server", 生产环境, "right
   now", ``intents.without_request``; of a long message only ``intents.parsed_part``, as ``parse``) as
   ``strong_match`` (4) requires -> knowledge (``strong_match``): "what time does the nightly backup
   run?", "磁盘使用率超过多少会触发告警", "CPU 告警阈值是多少"; "现在几点", "how much memory is free", "is
   port 22 open on web-01?", "生产环境的CPU使用率是多少？" leave nothing and keep their tool.
   ``statement``: the message only states facts or preferences to keep, or takes them back
   (``distill.takes_back``), as the user memory's rules read them ("remember that the staging host
   is stage-7", "以后用中文回答", "forget my home address"; no question) -> general.
3. ``follow_up``: the previous answer quoted documents (the offline agent's documents answer, with a
   ``[name §location]`` citation; not, say, a history answer quoting one), this message is short (at
   most 8 words, or 16 CJK characters), is no thanks or greeting, is not answered by what the user
   told the assistant (their long-term memory), and refers back ("and its port?", "那它的端口呢";
   ``REFERS_BACK``) or shares a search term with the passages the previous answer quoted -> knowledge;
   the retrieval query is the previous question (the last one with a term of its own) plus this one
   ("and its default?" finds the passage about the timeout), and only the passages holding one of this
   message's own key terms are quoted ("and its port?" quotes the port, not again the passage the
   previous answer quoted; a message with no key term of its own, "tell me more", "and how do I fix
   it?", goes by the previous question's).
4. ``strong_match``: the best passage for the message holds at least 60% of the message's distinct
   terms (``match_terms``: English words, Chinese characters and character pairs, without the words
   that only ask, ``ASKED``: "how many", 多少, 什么, 意思, "fix"), among them at least 2 words (of
   Chinese, character pairs) -> knowledge.
5. otherwise general (``default``; ``no_documents`` when the user can see no document).

A knowledge answer quotes only passages that hold at least one key term of the question
(``key_terms``: no stopword, no word naming the documents, no word that only asks); when none does,
it says the documents have nothing about it. A passage text is quoted once (a file uploaded twice);
passages of different documents under one citation (an edited file uploaded again under its name)
are quoted the most recently uploaded first, each citation followed by its document's upload time.

Every turn records ``{"route", "method", "reason", "query"?}`` in its context metadata (``route``).
The LLM agent decides by calling ``search_knowledge`` or not; ``record_model_route`` records that.
Passages are quoted (Markdown block quotes with their citation), never followed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.agent.intents import COMMAND, parsed_part, without_request
from server.memory.analyze import CJK_STOP_CHARS, analyze
from server.memory.distill import MAX_ITEMS_PER_MESSAGE, distill_rules, takes_back
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
#: words that only say what kind of answer is wanted: how much / how long, 多少, 什么, 意思, and what to
#: do about it (fix, 解决): a passage about the subject answers them without holding them (``key_terms``)
ASKED = re.compile(
    r"\bhow\s+(?:much|many|long|often|far|big|large|soon|old)\b|\bwhat\s+kind\s+of\b|"
    r"\b(?:fix(?:es|ed|ing)?|solve[sd]?|solving|resolve[sd]?|resolving|repair(?:s|ed|ing)?|handl(?:e|es|ed|ing)|"
    r"troubleshoot(?:s|ed|ing)?|remed(?:y|ies)|mitigat(?:e|es|ed|ing)|work\s*around|deal)\b|"
    r"多长时间|多少时间|多久|多少|多长|多大|多高|多远|多快|几点钟?|几个|几次|几天|什么时候|什么|啥|怎么样|怎么办|"
    r"怎么|怎样|如何|为什么|为何|哪个|哪些|哪里|哪儿|几|哪|意思|是否|能否|能不能|可不可以|是不是|有没有|请问|"
    r"解决|处理|修复|排查|应对|吗|呢", re.IGNORECASE | re.ASCII)
#: the intents a document can outrank: a question about the machine's metrics or the time, or whether a
#: port answers, names the subject the document is about ("what time does the nightly backup run?");
#: history, files, logs, downloads and memory requests name what to read
OUTRANKED = frozenset({"cpu", "memory", "disk", "network", "load", "uptime", "overview", "processes", "clock",
                       "network_check"})
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


def _asked_about(messages: list[dict[str, Any]]) -> str | None:
    """The last question before the new (last) message that says what it asks about (``key_terms``),
    going back over follow-ups with no term of their own ("tell me more", "and how do I fix it?");
    else the last question."""
    last = None
    for m in reversed(messages[:-1]):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            last = last or m["content"]
            if key_terms(m["content"]):
                return m["content"]
    return last


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
    return {term for term in _terms(search_query(text)) if _is_word(term)}


def key_terms(text: str) -> set[str]:
    """The ``search_terms`` of ``text`` that say what it is about: without the words that only ask
    (``ASKED``: "how many", 多少, 什么, 意思, "fix"). "错误码 E1024 是什么意思" -> 错误, 误码, e1024."""
    return search_terms(ASKED.sub(" ", search_query(text)))


def match_terms(text: str, request: bool = False) -> set[str]:
    """What the best passage must hold for ``strong_match``: the analyzed terms (of CJK text, characters
    and character pairs) of ``search_query(text)`` without the words that only ask (``ASKED``) and,
    for a system ``request``, without what makes it one (``intents.without_request``): "what time does
    the nightly backup run?" -> nightli, backup, run; "how much memory is free" -> none."""
    text = ASKED.sub(" ", search_query(text))
    return _terms(without_request(text) if request else text)


def _terms(text: str) -> set[str]:
    return {term for term in analyze(text) if term not in ROUTING_TERMS and term not in ASKING_TERMS}


def _is_word(term: str) -> bool:
    """A term that says something on its own: a word, or a CJK character pair with no function character."""
    return not _CJK.match(term) or (len(term) == 2 and not CJK_STOP_CHARS.intersection(term))


def statement_items(text: str) -> list[tuple[str, str]]:
    """What the user memory does with the message when every sentence of it is a fact or preference
    it keeps (``distill_rules``: (kind, text)) or takes something back (``takes_back``: ("forget",
    what) or ("no longer", "<subject> is <value>")), nothing else asked: those, the kept ones first;
    else []."""
    parts = sentences(text)
    if not parts or len(parts) > MAX_ITEMS_PER_MESSAGE:      # (more sentences than items are ever kept)
        return []
    items = distill_rules(text) + takes_back(text)
    return items if len(items) == len(parts) else []


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
        if OUTRANKED.issuperset(tool_intents) and not COMMAND.match(text):
            route = await _strong_match(source, user_id, text, match_terms(parsed_part(text), request=True),
                                        f" the system request ({', '.join(tool_intents)}) leaves")
            if route is not None:
                return route
        return Route("general", "intent", f"a system request: {', '.join(tool_intents)}")
    if stated:
        return Route("general", "statement", "the message states facts or preferences to keep, asks nothing")
    prev_answer = _previous(messages, "assistant")
    prev_question = _asked_about(messages)
    if prev_answer and prev_answer.startswith((ANSWER_HEAD_EN, ANSWER_HEAD_ZH)) and CITATION.search(prev_answer) \
            and prev_question and is_follow_up(text) and not remembered and _refers_to(text, prev_answer):
        query = search_query(f"{prev_question} {text}")
        return Route("knowledge", "follow_up", "a short follow-up to an answer from the documents", query,
                     text if key_terms(text) else query)
    route = await _strong_match(source, user_id, text, match_terms(text), " of the message")
    return route or Route("general", "default", "no document mention and no strong match")


async def _strong_match(source: Any, user_id: str, text: str, terms: set[str], of: str) -> Route | None:
    """The ``strong_match`` route when the best passage for ``text`` holds at least ``STRONG_SHARE`` of
    the ``match_terms`` ``terms``, among them at least ``STRONG_MIN_TERMS`` words (``_is_word``: of
    Chinese, character pairs); else None."""
    if sum(map(_is_word, terms)) < STRONG_MIN_TERMS:
        return None
    hits = await source.search(user_id, text, 1)
    if not hits:
        return None
    held = terms & set(analyze(hits[0].text + " " + " ".join(hits[0].location.get("heading", []))))
    if sum(map(_is_word, held)) >= STRONG_MIN_TERMS and len(held) >= STRONG_SHARE * len(terms):
        return Route("knowledge", "strong_match",
                     f"{hits[0].citation} holds {len(held)} of the {len(terms)} search terms{of}", text, text)
    return None


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


def upload_times(call: Any) -> dict[str, str]:
    """{doc_id: uploaded_at} of the documents whose passages in ``call`` share a citation with a passage
    of another document (an edited file uploaded again under its name); {} when none do. The times
    are the passages' own (``search_knowledge`` gives each its document's upload time)."""
    by_citation: dict[Any, set[Any]] = {}
    times: dict[str, str] = {}
    for p in passages_of(call):
        by_citation.setdefault(p.get("citation"), set()).add(p.get("doc_id"))
        if isinstance(p.get("uploaded_at"), str):
            times[p["doc_id"]] = p["uploaded_at"]
    clashing = {d for ids in by_citation.values() if len(ids) > 1 for d in ids}
    return {d: t for d, t in times.items() if d in clashing}


def _distinct(found: list[dict[str, Any]], uploaded: dict[str, str]) -> list[dict[str, Any]]:
    """``found`` with each passage text once (the same section of a file uploaded twice, or of two
    copies): in the place of its best-scored copy, from the most recently uploaded document holding it."""
    best: dict[str, dict[str, Any]] = {}
    for p in found:
        text = " ".join(str(p.get("text", "")).split())
        kept = best.setdefault(text, p)
        if uploaded.get(p.get("doc_id"), "") > uploaded.get(kept.get("doc_id"), ""):
            best[text] = {**p, "score": kept.get("score")}
    return list(best.values())


def _newest_first(quoted: list[dict[str, Any]], uploaded: dict[str, str]) -> list[dict[str, Any]]:
    """``quoted`` with the passages that share a citation (different documents under one name) next to
    each other where the first of them was, the most recently uploaded first."""
    by_citation: dict[Any, list[dict[str, Any]]] = {}
    for p in quoted:
        by_citation.setdefault(p.get("citation"), []).append(p)
    return [p for same in by_citation.values()
            for p in sorted(same, key=lambda p: uploaded.get(p.get("doc_id"), ""), reverse=True)]


def _source_line(p: dict[str, Any], uploaded: dict[str, str], newest: bool, zh: bool) -> str:
    """"— [name §location]", and for a citation that several quoted documents share, the upload time
    of this one ("uploaded 2026-11-27 13:09:41 UTC, the newest")."""
    line = f"— {p.get('citation', '')}"
    when = uploaded.get(p.get("doc_id"))
    if when:
        at = f"{when[:19].replace('T', ' ')} UTC"
        if zh:
            line += f"（上传于 {at}{'，最新' if newest else ''}）"
        else:
            line += f" (uploaded {at}{', the newest' if newest else ''})"
    return line


def answer(call: Any, zh: bool, focus: str, uploaded: dict[str, str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The offline answer quoting the best passages, and the citations it carries. Only the passages
    holding one of ``focus``'s ``key_terms`` (the question's, or a follow-up's own) are quoted: "and its
    port?" quotes the passage about the port, not the one the previous answer quoted again, and a
    passage that merely says "this page documents ..." is not quoted for a question the documents do
    not answer. None holding one: the documents have nothing about it. A text is quoted once; passages
    of different documents under one citation (``uploaded``: their upload times, ``upload_times``) are
    quoted the newest first, each with its upload time."""
    uploaded = uploaded or {}
    found = passages_of(call)
    if not found and call.status != "success":
        return ("知识库检索失败。" if zh else "The document search failed."), []
    terms = key_terms(focus)
    if not terms:
        return ("请告诉我要在知识库里查找什么。" if zh else "Tell me what to look for in your documents."), []
    found = [p for p in found if covered(terms, str(p.get("text", "")) + " " + str(p.get("citation", "")))]
    if not found:
        return ("知识库里没有找到相关内容。" if zh else "I found nothing about that in your documents."), []
    found = _distinct(found, uploaded)
    best = found[0].get("score") or 0
    quoted = [p for p in found[:QUOTE_TOP] if (p.get("score") or 0) >= 0.5 * best] or found[:1]
    citations = [p.get("citation") for p in quoted]
    dated = {p["doc_id"]: uploaded[p["doc_id"]] for p in quoted
             if citations.count(p.get("citation")) > 1 and p.get("doc_id") in uploaded}
    quoted = _newest_first(quoted, dated)
    parts = [ANSWER_HEAD_ZH if zh else ANSWER_HEAD_EN]
    for n, p in enumerate(quoted):
        text = str(p.get("text", ""))
        if len(text) > QUOTE_CHARS:
            text = text[:QUOTE_CHARS] + "…"
        block = "\n".join("> " + line if line.strip() else ">" for line in text.splitlines())
        newest = n == 0 or quoted[n - 1].get("citation") != p.get("citation")
        parts.append(f"{block}\n\n{_source_line(p, dated, newest, zh)}")
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

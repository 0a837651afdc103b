"""Distilling durable facts and preferences from a user's message.

Embedded default (no model): rules, English and Chinese. A sentence of a *user* message is kept
when it states something about the user or their systems ("my ... is", "our ... are", "the prod DB
host is db-prod-42", "I prefer", "call me", "我叫", "我的…是", "我们的…在", "记住") -- a fact -- or
asks for a lasting way of answering ("answer in Chinese", "always reply briefly", "以后用中文回答",
"请用英文回复") -- a preference. Questions are never kept, nor are conditionals as facts. Words that
only lead into a sentence ("Actually,", "Correction:", "FYI", "其实", "更正：", "remember that") are
left out of the item and of its subject, so "Correction: the prod DB host is db-prod-43" is kept as
"The prod DB host is db-prod-43" and replaces "... is db-prod-42". With a summary model configured,
``distill_with_model`` asks it for the same kind of list as JSON and falls back to the rules when
the answer is not usable.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

from server.memory.extractive import is_fact, sentences

log = logging.getLogger("nplt.memory")

MAX_ITEM_CHARS = 240
MAX_ITEMS_PER_MESSAGE = 8

_PREFERENCE = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(?:answer|reply|respond|write|talk|speak)\s+(?:to me\s+)?(?:only\s+)?in\s+[A-Za-z]+",
    r"\b(?:always|never|from now on|in future|going forward)\b.{0,60}\b(?:answer|reply|respond|use|show|"
    r"give|write|include|call)\b",
    r"\bI\s+(?:prefer|like|want)\b.{0,40}\b(?:answers?|replies|responses|output|format|language)\b",
    r"(?:以后|今后|总是|始终|永远|一律|请用|请使用|用中文|用英文|用英语).{0,20}(?:回答|回复|答复|交流|说|写)",
    r"(?:不要|别).{0,20}(?:回答|回复|使用|用)",
)]
_SYSTEM_FACT = re.compile(
    r"\b(?:host|hostname|server|database|db|cluster|ip|endpoint|url|port|path|region|account|bucket|"
    r"namespace|password|user ?name|version|timezone|time zone|email|team|project)\b[\w .'/-]{0,40}?"
    r"\s+(?:is|are|=|:|lives at|runs on)\s+\S+", re.IGNORECASE)
#: a question, or a request to be told something, is never kept (nor is any sentence with one of these)
_QUESTION = [re.compile(p, re.IGNORECASE) for p in (
    r"[?？]\s*$",
    r"^(?:what|which|who|whose|where|when|why|how|is|are|was|were|do|does|did|can|could|would|should)\b",
    r"^(?:please\s+|pls\s+)?(?:(?:can|could|would|will)\s+you\s+)?(?:tell|show|remind)\s+me\b",   # "tell me what ..."
    r"\b(?:let me know|do you (?:know|remember)|I\s+(?:am\s+|was\s+)?wonder(?:ing)?|I'm\s+wondering|"
    r"(?:I\s+(?:want|need|would like)|I'd like)\s+to\s+know|(?:not sure|don't know|do not know)\s+(?:whether|if))\b",
    r"哪(?!怕)|谁|啥|什么|多少|(?<![好十])几(?:个|台|号|点|天|次|年|月|位|种|条|岁|分钟|小时|周)|是否|"
    r"有没有|是不是|能不能|会不会|要不要|对不对|可不可以|好不好|行不行",                      # 哪个, 在哪个机房
    r"(?:吗|呢|怎么|如何|怎样|怎么样|为什么|为何)[。？?！!]?\s*$",
)]
#: question words that mean "any" or "and so on" in a statement, left out before looking for a
#: question: "不管什么问题都用中文回答" (whatever the question), "谁都可以", "MySQL、Redis什么的"
_ZH_INDEFINITE = re.compile(r"(?:不管|无论|不论)[^，,。]{0,8}?(?:什么|谁|哪|多少)|(?:什么|谁|哪儿|哪里)(?:都|也)|没什么|什么的")
#: a hypothesis states nothing ("If my DB host is db-9, what port should I use"): never a fact; a
#: conditional preference is kept but corrects nothing ("If I write in English, answer in English")
_CONDITIONAL = re.compile(r"^\s*(?:if|unless|suppose|supposing|assuming|in case|provided|如果|假如|假设|要是|若|万一|倘若)"
                          r"(?![A-Za-z])", re.IGNORECASE)
_SECRET = re.compile(r"(?:password|passwd|secret|token|api[ _-]?key|密码|口令)", re.IGNORECASE)

DISTILL_PROMPT = (
    "Extract the durable facts and preferences the USER states about themselves, their work or their "
    "systems in the message below (names, hosts, paths, settings, how they want answers). Skip "
    "questions, one-off requests and anything uncertain; never include secrets such as passwords or "
    "keys. Word a fact as \"<what> is <value>\" when it has that shape (\"The prod DB host is "
    "db-prod-42\"), so a later correction replaces it. Answer with JSON only: a list of objects "
    "{\"kind\": \"fact\" or \"preference\", \"text\": \"one short sentence in the user's "
    "language\"}; [] when there is nothing durable.")


#: the words that only ask to keep what follows: dropped from the kept item when what follows is a
#: fact or preference by itself ("Remember that the staging server is stage-7" keeps "The staging
#: server is stage-7"; "Remember to check the disk" is kept whole)
_LEAD_IN = re.compile(r"^\s*(?:(?:please|pls)\s+)?(?:remember|don't forget|do not forget|note|keep in mind|"
                      r"for future reference)\b(?:\s+that\b)?[\s,:：-]*|^\s*(?:请)?(?:记住|记一下|请记)[，,:：\s]*",
                      re.IGNORECASE)


#: the words a sentence may open with that only lead into what it says: dropped from the kept item
#: and from its subject ("Actually, the prod DB host is db-prod-42" keeps "The prod DB host is
#: db-prod-42", which corrects "The prod DB host is db-prod-41"). Words that never start a statement
#: themselves, with or without a comma after them ...
_MARKER_WORDS = ("actually", "fyi", "btw", "by the way", "oh and", "oh", "and", "but", "also", "anyway", "in fact",
                 "just so you know", "to be clear", "i mean", "i meant", "my bad", "my mistake", "oops",
                 "其实", "对了", "哦对了", "顺便说一下", "顺便说一句", "纠正一下", "更正一下", "补充一下")
#: ... and labels, only before a colon, comma or dash ("Update: the ...", not "Update the config";
#: "Sorry, the ...", not "Sorry for the delay"; "另外，…", not "另外一台…")
_MARKER_LABELS = ("correction", "update", "edit", "fix", "ps", "no", "ok", "okay", "well", "wait", "sorry",
                  "sorry for the confusion", "sorry about that", "更正", "更新", "纠正", "补充", "不对", "另外")


def _alternatives(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))   # the longest first


_MARKER = re.compile(rf"^\s*(?:(?:{_alternatives(_MARKER_WORDS)})(?![A-Za-z])[\s,，:：;；!！-]*|"
                     rf"(?:{_alternatives(_MARKER_LABELS)})\s*[,，:：;；!！—–-]+\s*)", re.IGNORECASE)

#: "<subject> is <one value>": a statement that a later one about the same subject corrects
#: ("The prod DB host is db-prod-41" -> "... is db-prod-42 now", "... is now db-prod-42"). One word of
#: value only: "My son is 5" and "My son is a doctor" are two facts, not a correction.
_SUBJECT_VALUE = re.compile(r"^\s*(?P<subject>[\w][\w .'/-]{0,60}?)(?:\s*[=:]|\s+(?:is|are|lives at|runs on))\s+"
                            r"(?:(?:now|currently|nowadays)\s+)?"
                            r"(?P<value>[^\s,;]+?)(?:,?\s+(?:now|currently|nowadays|these days|from now on|today|again))?"
                            r"\s*[.!。！]?\s*$", re.IGNORECASE)
#: the same in Chinese, "<subject>是/在<value>". A 是 or 在 inside another word is not the verb
#: (但是, 总是, 不是, 也是; 现在, 正在, 存在, 不在), so "我的常用编辑器是vim" is about "我的常用编辑器"
_ZH_SUBJECT_VALUE = re.compile(r"^\s*(?P<subject>[^，,。；;\s]{1,24}?)"
                               r"(?P<verb>(?<![但还总就可于要若只凡或不也都])是|(?<![现正存所实好不])在)"
                               r"(?P<value>[^，,。！!\s]+)\s*[。.!！]?\s*$")
#: "now" before the verb: "我们的数据库现在在上海" is about what "我们的数据库在杭州" is about
_ZH_NOW = re.compile(r"(?:现在|目前|如今|已经|现已|已)+$")
#: a pronoun alone is not a subject: "我是张三" and "我是后端工程师" are two facts ("I am ..." has no key)
_ZH_PRONOUNS = frozenset(("我", "我们", "咱们", "你", "你们", "他", "她", "它", "他们", "她们", "这", "那", "这个", "那个"))
_CALL_ME = re.compile(r"^\s*(?:please\s+)?call me\s+\S+\s*[.!]?\s*$|^\s*(?:请)?(?:叫我|我叫)\S+?[。！!]?\s*$",
                      re.IGNORECASE)
_LEADING_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)

#: the languages answers can be asked in, by the names users give them ("answer in short sentences"
#: asks for no language)
_LANGUAGES = {
    "chinese": ("chinese", "mandarin", "中文", "汉语", "普通话"), "cantonese": ("cantonese", "粤语"),
    "english": ("english", "英文", "英语"), "japanese": ("japanese", "日语", "日文"), "korean": ("korean", "韩语", "韩文"),
    "french": ("french", "法语", "法文"), "german": ("german", "德语", "德文"), "spanish": ("spanish", "西班牙语"),
    "russian": ("russian", "俄语", "俄文"), "portuguese": ("portuguese", "葡萄牙语"), "italian": ("italian", "意大利语"),
    "arabic": ("arabic", "阿拉伯语"), "vietnamese": ("vietnamese", "越南语"), "dutch": ("dutch",), "hindi": ("hindi",),
}
_LANGUAGE_OF = {name: language for language, names in _LANGUAGES.items() for name in names}
_ANSWER_LANGUAGE = re.compile(
    r"\b(?:answer|reply|respond|write|talk|speak)\s+(?:(?:to\s+)?me\s+)?(?:only\s+)?in\s+(?P<name>[A-Za-z]+)|"
    rf"(?:用|使用)(?P<zh>{_alternatives(n for n in _LANGUAGE_OF if not n.isascii())})", re.IGNORECASE)
#: a negation before the request, in its clause: "Never answer in French", "I don't want you to
#: reply in English"; in Chinese just before it ("不要用英文回答", "以后别再用英文回复"; not
#: "特别是…都用中文回答")
_NEGATION = re.compile(r"\b(?:never|not|no longer|stop|no need)\b|n't\b|\bdont\b|"
                       r"(?:不要|不再|不许|不能|不必|别|勿|禁止)\S{0,4}$|不$", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[,;，；。]")


def _language_key(text: str) -> str | None:
    """A preference for the language of the answers: one key for every positive one (a later "answer
    in English" corrects "answer in Chinese"); a negative one ("never answer in French") is only
    about that language, so it leaves the positive one alone. "不要用英文，用中文回答" is positive."""
    negative = None
    for m in _ANSWER_LANGUAGE.finditer(text):
        language = _LANGUAGE_OF.get((m.group("name") or m.group("zh")).casefold())
        if language is None:
            continue
        if not _NEGATION.search(_CLAUSE_END.split(text[:m.start()])[-1]):
            return "preference:answer language"
        negative = negative or f"preference:not answer language:{language}"
    return negative


def subject_key(kind: str, text: str) -> str | None:
    """What a statement is about, when a later statement about the same thing replaces it: the
    subject of "<subject> is <value>" (one-word value; "is now <value>"; "我的名字是张三", "数据库在杭州",
    "数据库现在在上海"), "call me", or, for a preference, the language answers are to be in (or, when
    negated, not to be in). Leading discourse markers ("Actually,", "Correction:", "其实") are not
    part of the subject. None: the statement stands beside others ("I prefer short answers", "My
    son is a doctor", "我们用PostgreSQL", "我是张三", a conditional)."""
    text = _plain(" ".join(text.split()))
    if _CONDITIONAL.match(text):
        return None
    if kind == "preference":
        return _language_key(text)
    if _CALL_ME.match(text):
        return "fact:call me"
    m = _SUBJECT_VALUE.match(text)
    if m is not None:
        subject = _LEADING_ARTICLE.sub("", m.group("subject").casefold())
        return f"fact:{subject}"
    m = _ZH_SUBJECT_VALUE.match(text)
    if m is not None:
        subject = _ZH_NOW.sub("", m.group("subject"))
        return None if not subject or subject in _ZH_PRONOUNS else f"fact:{subject}{m.group('verb')}"
    return None


def _plain(sentence: str) -> str:
    """The sentence without the words that only lead into it: discourse markers ("Actually,",
    "FYI", "更正：") and the words that ask to keep it ("remember that", "记住"), these only when what
    follows is a fact or preference by itself ("Remember to check the disk" is kept whole)."""
    text = sentence
    while True:
        rest = _MARKER.sub("", text, count=1)
        if rest == text:
            rest = _LEAD_IN.sub("", text, count=1)
            if rest != text and classify(rest) is None:
                rest = text
        if rest == text or not rest.strip():
            break
        text = rest.lstrip()
    return text if text == sentence else text[0].upper() + text[1:]


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


def classify(sentence: str) -> str | None:
    """``"preference"``, ``"fact"`` or None for one sentence of a user message."""
    s = sentence.strip()
    if not s or _SECRET.search(s):
        return None
    unasked = _ZH_INDEFINITE.sub("", s)
    if any(p.search(unasked) for p in _QUESTION):
        return None
    if any(p.search(s) for p in _PREFERENCE):
        return "preference"
    if _CONDITIONAL.match(s):
        return None
    if is_fact(s) or _SYSTEM_FACT.search(s):
        return "fact"
    return None


def distill_rules(text: str) -> list[tuple[str, str]]:
    """(kind, text) of the durable statements of one user message, in order, at most
    ``MAX_ITEMS_PER_MESSAGE``."""
    out: list[tuple[str, str]] = []
    for s in sentences(text):
        plain = _plain(s)
        kind = classify(plain)
        if kind is not None:
            out.append((kind, _clip(plain)))
        if len(out) >= MAX_ITEMS_PER_MESSAGE:
            break
    return out


def parse_model_answer(answer: str) -> list[tuple[str, str]] | None:
    """The model's JSON list as (kind, text) pairs; None when it is not a usable answer."""
    m = re.search(r"\[.*\]", answer, re.DOTALL)
    if m is None:
        return None
    try:
        data = json.loads(m.group(0))
    except ValueError:
        return None
    if not isinstance(data, list):
        return None
    out = []
    for d in data[:MAX_ITEMS_PER_MESSAGE]:
        if not isinstance(d, dict) or not isinstance(d.get("text"), str) or not d["text"].strip():
            return None
        if _SECRET.search(d["text"]):
            continue
        out.append(("preference" if d.get("kind") == "preference" else "fact", _clip(d["text"])))
    return out


async def distill_with_model(agent: Any, model: str | None, text: str) -> list[tuple[str, str]]:
    """Ask the summary model; the rules' answer when it fails or answers something unusable."""
    try:
        answer = await agent.complete([{"role": "system", "content": DISTILL_PROMPT},
                                       {"role": "user", "content": text}], model)
    except Exception as exc:   # the provider failed (AgentError) or the agent has a bug: the rules still work
        log.warning("memory: distilling with the model failed (%s: %s); the rules are used instead",
                    type(exc).__name__, exc)
        return distill_rules(text)
    parsed = parse_model_answer(answer or "")
    return distill_rules(text) if parsed is None else parsed

"""Distilling durable facts and preferences from a user's message.

Embedded default (no model): rules, English and Chinese. A sentence of a *user* message is kept
when it states something about the user or their systems ("my ... is", "our ... are", "the prod DB
host is db-prod-42", "I prefer", "call me", "我叫", "我的…是", "我们的…在", "记住") -- a fact -- or
asks for a lasting way of answering ("answer in Chinese", "always reply briefly", "以后用中文回答",
"请用英文回复") -- a preference. Questions are never kept. With a summary model configured,
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
_QUESTION = re.compile(r"[?？]\s*$|^\s*(?:what|which|who|where|when|why|how|is|are|do|does|can|could)\b|"
                       r"(?:吗|呢|什么|哪|几|怎么|如何|是否)[。？?]?\s*$", re.IGNORECASE)
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


#: "<subject> is <one value>": a statement that a later one about the same subject corrects
#: ("The prod DB host is db-prod-41" -> "... is db-prod-42 now"). One word of value only: "My son is
#: 5" and "My son is a doctor" are two facts, not a correction.
_SUBJECT_VALUE = re.compile(r"^\s*(?P<subject>[\w][\w .'/-]{0,60}?)(?:\s*[=:]|\s+(?:is|are|lives at|runs on))\s+"
                            r"(?P<value>[^\s,;]+?)(?:,?\s+(?:now|nowadays|these days|from now on|today|again))?\s*[.!。！]?\s*$",
                            re.IGNORECASE)
_ZH_SUBJECT_VALUE = re.compile(r"^\s*(?P<subject>[^是在用，,。\s]{1,24}?)(?P<verb>是|在|用)"
                               r"(?P<value>[^，,。！!\s]+)\s*[。.!！]?\s*$")
_CALL_ME = re.compile(r"^\s*(?:please\s+)?call me\s+\S+\s*[.!]?\s*$|^\s*(?:请)?(?:叫我|我叫)\S+?[。！!]?\s*$",
                      re.IGNORECASE)
_ANSWER_LANGUAGE = re.compile(
    r"\b(?:answer|reply|respond|write|talk|speak)\s+(?:to me\s+)?(?:only\s+)?in\s+[A-Za-z]+|"
    r"(?:用|使用)(?:中文|汉语|英文|英语|日语|日文)", re.IGNORECASE)
_LEADING_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def subject_key(kind: str, text: str) -> str | None:
    """What a statement is about, when a later statement about the same thing replaces it: the
    subject of "<subject> is <value>" (one-word value; "我的名字是张三", "数据库在杭州"), "call me",
    or, for a preference, the language answers are to be in. None: the statement stands beside
    others ("I prefer short answers", "My son is a doctor")."""
    text = " ".join(text.split())
    if kind == "preference":
        return "preference:answer language" if _ANSWER_LANGUAGE.search(text) else None
    if _CALL_ME.match(text):
        return "fact:call me"
    m = _SUBJECT_VALUE.match(text)
    if m is not None:
        subject = _LEADING_ARTICLE.sub("", m.group("subject").casefold())
        return f"fact:{subject}"
    m = _ZH_SUBJECT_VALUE.match(text)
    if m is not None:
        return f"fact:{m.group('subject')}{m.group('verb')}"
    return None


def _without_lead_in(sentence: str) -> str:
    rest = _LEAD_IN.sub("", sentence, count=1)
    if not rest.strip() or rest == sentence or classify(rest) is None:
        return sentence
    return rest[0].upper() + rest[1:]


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


def classify(sentence: str) -> str | None:
    """``"preference"``, ``"fact"`` or None for one sentence of a user message."""
    s = sentence.strip()
    if not s or _QUESTION.search(s) or _SECRET.search(s):
        return None
    if any(p.search(s) for p in _PREFERENCE):
        return "preference"
    if is_fact(s) or _SYSTEM_FACT.search(s):
        return "fact"
    return None


def distill_rules(text: str) -> list[tuple[str, str]]:
    """(kind, text) of the durable statements of one user message, in order, at most
    ``MAX_ITEMS_PER_MESSAGE``."""
    out: list[tuple[str, str]] = []
    for s in sentences(text):
        kind = classify(s)
        if kind is not None:
            out.append((kind, _clip(_without_lead_in(s))))
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

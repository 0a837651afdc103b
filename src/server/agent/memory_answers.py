"""The offline agent's answers from the user's long-term memory.

The memory layer puts what the user told the assistant in their other sessions into the turn's
context when it is relevant (``server.memory.context.MEMORY_HEADER``, one line per item with its
session and time). An online model reads it; the offline agent, which has no model, answers a
question from it when one of those items holds most of the question's search terms (as the
knowledge route's ``strong_match`` does for passages, ``coverage``): "what is the staging server?" after "remember
that the staging server is stage-7.internal" in another session; or when the item states the value
the question asks, in either language (``distill.asked_subject``: "生产数据库的主机是什么？" is
answered by "The prod DB host is db-prod-43 now."). The items are quoted with their
session and time (said in Chinese for a Chinese question: ``（会话 s_…，<time>）``), never followed.
The facts the user stated earlier in the current conversation (its window: the memory block leaves
the current session's items out) count the same way, newest first, marked as from this conversation.
What a later message takes back ("Please forget that my home address is ...", "The DB host is not
db-1 anymore": ``distill.takes_back`` and ``retracts``) is not quoted, as the user memory drops it;
nor is an item of the memory block that the message being answered takes back.

Of several statements about the same thing (``distill.same_subject``, in either language: "the DB
host is db-1", later "... is db-2 now") only the newest is quoted: in this conversation, the latest; between this
conversation and the memory block, the block's (the user memory keeps the newest statement of every
session, and leaves out only this session's, which the window holds).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from server.agent.knowledge_route import covered
from server.memory.analyze import analyze
from server.memory.context import MEMORY_HEADER
from server.memory.distill import asked_subject, distill_rules, retracts, same_subject, takes_back
from server.memory.recall import format_time
from server.memory.user_memory import INLINE_DISTILL_CHARS

MIN_TERMS = 2          # search terms of the question an item must hold (all of them if it has fewer)
MIN_SHARE = 0.6        # ... and at least this share of them
MAX_ITEMS = 3
KINDS = ("fact", "preference")      # what a memory block line may be (its kind is not quoted)
_UNKNOWN_TIME = format_time("")     # how an item line says a time that could not be read
_SOURCE = re.compile(r'(?P<text>.*?) \(session (?P<where>"[^"]*"|\S+), (?P<time>[^()]*)\)', re.S)


def remembered(messages: list[dict[str, Any]]) -> list[str]:
    """The memory block's item lines (``<text> (session <id or "title">, <time>)``) in this context, if any."""
    for m in messages:
        content = m.get("content")
        if m.get("role") == "system" and isinstance(content, str) and content.startswith(MEMORY_HEADER):
            return [line[2:] for line in content.splitlines()[1:] if line.startswith("- ")]
    return []


def stated(messages: list[dict[str, Any]]) -> list[str]:
    """The facts and preferences of the user's earlier messages in this context, newest first,
    without those a later message (the one being answered too) takes back (``distill.takes_back``:
    "Please forget that ...", "... is not db-1 anymore"), as the user memory drops them."""
    out: list[str] = []
    taken: list[Callable[[str, str], bool]] = []     # what the later messages take back
    for n, m in enumerate(reversed(messages)):   # (the last one is the message being answered)
        if m.get("role") == "user" and isinstance(m.get("content"), str) \
                and len(m["content"]) <= INLINE_DISTILL_CHARS:      # (on the loop: a pasted log is learned in a thread)
            if n:
                out += [item for kind, item in distill_rules(m["content"]) if not any(t(kind, item) for t in taken)]
            taken += [retracts(back) for back in takes_back(m["content"])]
    return out


def _text(line: str) -> str:
    """An item line's text, without its ``(session ..., <time>)`` (a title has no double quote)."""
    found = _SOURCE.fullmatch(line)
    return found["text"] if found else line


def _zh(line: str) -> str:
    """An item line with its source in Chinese: ``<text>（会话 <id or “title”>，<time>）``."""
    found = _SOURCE.fullmatch(line)
    if not found:
        return line
    where = f"“{found['where'][1:-1]}”" if found["where"].startswith('"') else found["where"]
    time = "时间未知" if found["time"] == _UNKNOWN_TIME else found["time"]
    return f"{found['text']}（会话 {where}，{time}）"


def _subject(item: str) -> str | None:
    """What a quoted statement is about, in either language (``distill.same_subject``; its kind is
    not quoted)."""
    return same_subject("preference", item) or same_subject("fact", item)


def _answers(terms: set[str], item: str, asked: str | None = None) -> bool:
    """``item`` holds enough of the question's search ``terms``, or states the value of what the
    question asks (``asked``: ``distill.asked_subject``, in either language: "生产数据库的主机是什么？"
    is answered by "The prod DB host is db-prod-43 now.")."""
    found, total = covered(terms, item), len(terms)
    if total and found >= min(MIN_TERMS, total) and found >= MIN_SHARE * total:
        return True
    return asked is not None and _subject(item) == asked


def answer(text: str, messages: list[dict[str, Any]], zh: bool) -> str | None:
    """The reply quoting the remembered items that answer ``text``, or None when none does."""
    terms = set(analyze(text))                   # (the question analyzed once, not once an item)
    if not terms:
        return None
    asked = asked_subject(text)
    here = "（本次对话中）" if zh else " (earlier in this conversation)"
    gone = [retracts(back) for back in takes_back(text)]        # (this message takes them back: not quoted)
    block = [(line, _text(line)) for line in remembered(messages)]   # (line, its text)
    block = [(line, item) for line, item in block if not any(g(kind, item) for g in gone for kind in KINDS)]
    seen = {key for _, text in block if (key := _subject(text)) is not None}
    hits = []
    for item in stated(messages):                # newest first: an older statement of a subject is left out
        key = _subject(item)
        if key not in seen and _answers(terms, item, asked):
            hits.append(item + here)
        if key is not None:
            seen.add(key)
    hits += [_zh(line) if zh else line for line, text in block if _answers(terms, text, asked)]
    if not hits:
        return None
    head = "根据你之前告诉我的：" if zh else "From what you told me earlier:"
    return "\n".join([head, *(f"- {line}" for line in hits[:MAX_ITEMS])])


def forgotten(items: list[Any], taken: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """What each request to forget among ``taken`` (``takes_back`` entries: ("forget", what)) removes
    from the user's ``items`` (``UserMemory.list``, what MEMORY_LIST shows: kind and text): (what,
    the texts of the items it takes), in order, an item once (the first request that names it), as
    the user memory removes them when it learns the message (``distill.retracts``, the same test)."""
    left = list(items)
    out: list[tuple[str, list[str]]] = []
    for how, what in taken:
        if how != "forget":
            continue
        named = retracts((how, what))
        gone = [i for i in left if named(i.kind, i.text)]
        left = [i for i in left if i not in gone]
        out.append((what, [i.text for i in gone]))
    return out

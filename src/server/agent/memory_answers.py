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
the current session's items out) count the same way, before the block's among equals, newest first,
marked as from this conversation.
What a later message takes back ("Please forget that my home address is ...", "The DB host is not
db-1 anymore": ``distill.takes_back`` and ``retracts``) is not quoted, as the user memory drops it;
nor is an item of the memory block that the message being answered takes back.

Of several statements about the same thing (``distill.same_subject``, in either language: "the DB
host is db-1", later "... is db-2 now") only the newest is quoted: in this conversation, the latest; between this
conversation and the memory block, the block's (the user memory keeps the newest statement of every
session, and leaves out only this session's, which the window holds).

The items that answer are quoted most exact first: an item stating the value the question asks
(``asked_subject``), then by how many of the question's search terms an item holds (a term the
question names that the item lacks, "billing" in "what is the host of service billing?" against
"The host of service search is node-2.internal.", counts against it), newest first only among
equals (this conversation's before the memory block's). Before, this conversation's items came
newest first whatever they held, so a sibling fact stated later led the answer.

This runs on the event loop every offline turn, so the rules are applied to a message of the window
once, not once a turn: what each message states and takes back is kept (``_rules``, a least recently
used memo of at most ``MEMO_CHARS`` characters of messages, per server process). A message of any
number of sentences counts with what the memory layer learns from it: its first
``MAX_ITEMS_PER_MESSAGE`` (8) statements (``distill_rules``; "We moved racks today. ... The staging
server is stage-7.internal. ... We left at six." states the staging server, in this conversation as in
the next one); one over ``INLINE_DISTILL_CHARS`` (4,000) characters is skipped (the memory layer learns
it in a worker thread). (Before, a message of more than 8 sentences was skipped too, as
``knowledge_route.statement_items`` skips it for its own test, so this conversation did not know what
a new one answered from memory.) Distilling a 4,000-character message takes ~2-10 ms, once (the
memo). The offline agent calls ``answer_async``: on the loop when at most 4,000 characters
of the window are not memoized (the message being answered, the one before), else in a worker thread
(the first turn of a long conversation after a restart, a window larger than the memo). Before, every
earlier message of the window was distilled again on every turn, on the loop: ~80-480 ms with 40
earlier 4,000-character messages.
"""
from __future__ import annotations

import asyncio
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

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
#: the characters of the messages whose rules ``_rules`` keeps (least recently used dropped first): a
#: message of at most 4,000 characters holds at most ~8 bytes a character with what it states, so
#: ~8 MB at worst, and thousands of ordinary messages
MEMO_CHARS = 1_000_000


@dataclass(frozen=True)
class _Item:
    """A statement of a message: its kind and text, its search terms and its subject (``_subject``)."""
    kind: str
    text: str
    terms: frozenset[str]
    subject: str | None


@dataclass(frozen=True)
class _Rules:
    """What one user message states (``distill_rules``) and the tests of what it takes back
    (``retracts`` of each ``takes_back`` entry)."""
    items: tuple[_Item, ...]
    taken: tuple[Callable[[str, str], bool], ...]


_NOTHING = _Rules((), ())
_memo: OrderedDict[str, _Rules] = OrderedDict()      # message text -> its rules (least recently used first)
_memo_chars = 0
_memo_lock = threading.Lock()


def _rules(text: str) -> _Rules:
    """What the user message ``text`` states (its first ``MAX_ITEMS_PER_MESSAGE`` statements, as the
    memory layer learns them: ``distill_rules``) and takes back, nothing for a message over
    ``INLINE_DISTILL_CHARS`` characters (on the loop: the memory layer learns it in a worker thread),
    from the memo when this text was seen before."""
    global _memo_chars
    if len(text) > INLINE_DISTILL_CHARS:
        return _NOTHING
    with _memo_lock:
        got = _memo.get(text)
        if got is not None:
            _memo.move_to_end(text)
            return got
    got = _Rules(tuple(_Item(kind, item, frozenset(analyze(item)), _subject(item))
                       for kind, item in distill_rules(text)),          # (at most MAX_ITEMS_PER_MESSAGE)
                 tuple(retracts(back) for back in takes_back(text)))
    with _memo_lock:
        if text not in _memo:
            _memo[text] = got
            _memo_chars += len(text)
            while _memo_chars > MEMO_CHARS:
                _memo_chars -= len(_memo.popitem(last=False)[0])
    return got


def remembered(messages: list[dict[str, Any]]) -> list[str]:
    """The memory block's item lines (``<text> (session <id or "title">, <time>)``) in this context, if any."""
    for m in messages:
        content = m.get("content")
        if m.get("role") == "system" and isinstance(content, str) and content.startswith(MEMORY_HEADER):
            return [line[2:] for line in content.splitlines()[1:] if line.startswith("- ")]
    return []


def _stated(messages: list[dict[str, Any]]) -> list[_Item]:
    """``stated``, with each item's terms and subject."""
    out: list[_Item] = []
    taken: list[Callable[[str, str], bool]] = []     # what the later messages take back
    for n, m in enumerate(reversed(messages)):   # (the last one is the message being answered)
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            rules = _rules(m["content"])
            if n:
                out += [item for item in rules.items if not any(t(item.kind, item.text) for t in taken)]
            taken += rules.taken
    return out


def stated(messages: list[dict[str, Any]]) -> list[str]:
    """The facts and preferences of the user's earlier messages in this context, newest first,
    without those a later message (the one being answered too) takes back (``distill.takes_back``:
    "Please forget that ...", "... is not db-1 anymore"), as the user memory drops them; of a long
    message its first ``MAX_ITEMS_PER_MESSAGE`` statements, and a message over 4,000 characters is
    skipped (``_rules``)."""
    return [item.text for item in _stated(messages)]


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


def _rank(terms: set[str], held: frozenset[str], subject: str | None, asked: str | None) -> tuple[bool, int] | None:
    """How exactly an item (its search terms ``held``, its ``subject``) answers a question (its search
    ``terms``, what it asks the value of, ``asked``: ``distill.asked_subject``), higher first: whether
    it states the value asked ("生产数据库的主机是什么？" is answered by "The prod DB host is db-prod-43
    now."), then how many of the terms it holds; None when it does neither enough (at least
    ``MIN_TERMS`` of the terms, all of them if there are fewer, and ``MIN_SHARE`` of them)."""
    found, total = len(terms & held), len(terms)
    exact = asked is not None and subject == asked
    if exact or (total and found >= min(MIN_TERMS, total) and found >= MIN_SHARE * total):
        return exact, found
    return None


def answer(text: str, messages: list[dict[str, Any]], zh: bool) -> str | None:
    """The reply quoting the remembered items that answer ``text``, or None when none does: the most
    exact first (``_rank``), newest first among equals (this conversation's before the memory block's)."""
    terms = set(analyze(text))                   # (the question analyzed once, not once an item)
    if not terms:
        return None
    asked = asked_subject(text)
    here = "（本次对话中）" if zh else " (earlier in this conversation)"
    gone = _rules(text).taken                    # (this message takes them back: not quoted)
    block = [(line, _text(line)) for line in remembered(messages)]   # (line, its text)
    block = [(line, item) for line, item in block if not any(g(kind, item) for g in gone for kind in KINDS)]
    block_subjects = [_subject(item) for _, item in block]
    seen = {key for key in block_subjects if key is not None}
    hits: list[tuple[tuple[bool, int], str]] = []
    for item in _stated(messages):               # newest first: an older statement of a subject is left out
        rank = _rank(terms, item.terms, item.subject, asked) if item.subject not in seen else None
        if rank is not None:
            hits.append((rank, item.text + here))
        if item.subject is not None:
            seen.add(item.subject)
    for (line, item), key in zip(block, block_subjects):
        rank = _rank(terms, frozenset(analyze(item)), key, asked)
        if rank is not None:
            hits.append((rank, _zh(line) if zh else line))
    if not hits:
        return None
    hits.sort(key=lambda hit: hit[0], reverse=True)    # (stable: newest first among equals)
    head = "根据你之前告诉我的：" if zh else "From what you told me earlier:"
    return "\n".join([head, *(f"- {line}" for _, line in hits[:MAX_ITEMS])])


def _unlearned(messages: list[dict[str, Any]]) -> int:
    """The characters of the window's user messages whose rules ``_rules`` would apply now (not
    memoized; those over ``INLINE_DISTILL_CHARS`` are skipped, not learned)."""
    with _memo_lock:
        return sum(len(c) for m in messages if m.get("role") == "user" and isinstance(c := m.get("content"), str)
                   and len(c) <= INLINE_DISTILL_CHARS and c not in _memo)


async def answer_async(text: str, messages: list[dict[str, Any]], zh: bool) -> str | None:
    """``answer``, on the loop when the rules of the window's messages are memoized but for at most
    ``INLINE_DISTILL_CHARS`` characters of them (the message being answered, the one before), else in
    a worker thread (the first turn of a long conversation after a restart, or a window the memo
    cannot hold: up to ~0.5 s of rules for 40 messages of 4,000 characters)."""
    if _unlearned(messages) > INLINE_DISTILL_CHARS:
        return await asyncio.to_thread(answer, text, messages, zh)
    return answer(text, messages, zh)


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

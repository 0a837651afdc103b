"""The offline summarizer: a deterministic, extractive rolling summary (no LLM needed).

It keeps four sections and folds a previous summary in (its bullets are parsed back):

    Goals and requests:      each user message without its stated facts (clipped)
    Facts and preferences:   user sentences like "my ... is", "I prefer", "remember", "我叫", "我的...是", "记住"
    Tool results:            tool name, short arguments and the first line of the result
    Recent topics:           the most frequent content words of the newly covered user messages

Each section is capped (oldest entries go first) so the summary stays bounded; facts get the
largest cap because they are what later turns ask about. Pure functions of their arguments (no
shared state): ``summarizer.summarize`` runs ``extractive_summary`` in a worker thread.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from typing import Iterable

from storage.models import ChatMessage

from server.memory.analyze import STOPWORDS

HEADER = "Conversation summary (extractive):"
SECTIONS = ("Goals and requests", "Facts and preferences", "Tool results")
TOPICS = "Recent topics"
CAPS = {"Goals and requests": 12, "Facts and preferences": 50, "Tool results": 8}
MAX_ITEM_CHARS = 200
MAX_TOPICS = 10

_FACT_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(my|our)\s+[\w .'/-]{1,60}?\s+(is|are|was|were|will be)\b",
    r"\bI\s*(?:'m|am)\s+(?:a|an|the|from|based|working|in)\b",
    r"\bI\s+(?:prefer|like|love|hate|dislike|use|always|never|usually|live|work|want you to)\b",
    r"\bwe\s+(?:use|run|prefer|rotate|deploy|host|keep|always|never)\b",
    r"\b(?:remember|don't forget|do not forget|note that|call me|for future reference)\b",
    r"(?:我叫|我的.{0,20}?是|我们的.{0,20}?(?:是|在|用)|记住|请记|我是|我喜欢|我更喜欢|我偏好|我习惯|我们用|我们使用|我住在|我在.{0,10}工作)",
)]
# a title or a short form before its name is no sentence end ("my dentist is Dr. Wu", "e.g. nginx")
ABBREVIATIONS = ("Dr", "Mr", "Mrs", "Ms", "Prof", "St", "Mt", "Jr", "Sr", "vs", "e.g", "i.e", "approx")
_NOT_AN_END = "".join(rf"(?<!\b{re.escape(a)}\.)" for a in ABBREVIATIONS)
_SENTENCE_SPLIT = re.compile(rf"(?<=[.!?;]){_NOT_AN_END}\s+|(?<=[。！？；])\s*|\n+")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")
_CJK_WORD = re.compile(r"[\u4e00-\u9fff]{2,}")


def _clip(text: str, limit: int = MAX_ITEM_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s and s.strip()]


def is_fact(sentence: str) -> bool:
    return any(p.search(sentence) for p in _FACT_PATTERNS)


def parse(summary: str) -> tuple[dict[str, list[str]], list[str]]:
    """Bullets per section and the topic list of an earlier extractive summary.

    Text that is not in this format (e.g. an LLM summary) is kept whole as one fact bullet.
    """
    items: dict[str, list[str]] = {s: [] for s in SECTIONS}
    topics: list[str] = []
    if not summary.strip():
        return items, topics
    if not summary.startswith(HEADER):
        items["Facts and preferences"].append(_clip(summary, 4 * MAX_ITEM_CHARS))
        return items, topics
    current = None
    for line in summary.splitlines()[1:]:
        if line.endswith(":") and line[:-1] in SECTIONS:
            current = line[:-1]
        elif line.startswith(f"{TOPICS}:"):
            topics = [t.strip() for t in line.split(":", 1)[1].split(",") if t.strip()]
        elif line.startswith("- ") and current is not None:
            items[current].append(line[2:])
    return items, topics


def _tool_line(call) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True) if call.arguments else ""
    result = next((ln for ln in (call.result or "").splitlines() if ln.strip()), "")
    status = "" if call.status == "success" else f" [{call.status}]"
    return _clip(f"{call.tool_name}({_clip(args, 60) if args else ''}){status}: {_clip(result, 120)}")


def topics_of(messages: Iterable[ChatMessage]) -> list[str]:
    """Most frequent content words (English words of 4+ letters, CJK runs of 2+ characters)."""
    counts: Counter[str] = Counter()
    cjk: Counter[str] = Counter()
    for m in messages:
        if m.role != "user":
            continue
        counts.update(w.lower() for w in _WORD.findall(m.content) if len(w) >= 4 and w.lower() not in STOPWORDS)
        for run in _CJK_WORD.findall(m.content):
            cjk.update(run[i:i + 2] for i in range(len(run) - 1))
    counts.update({w: n for w, n in cjk.items() if n >= 2})     # single CJK bigrams are mostly noise
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_TOPICS]]


def extractive_summary(previous: str, messages: list[ChatMessage]) -> str:
    """Fold ``previous`` (any text) and ``messages`` into a bounded extractive summary."""
    items, old_topics = parse(previous)
    for m in messages:
        if m.role == "user":
            request: list[str] = []
            for s in sentences(m.content):
                if is_fact(s):
                    items["Facts and preferences"].append(_clip(s))
                else:
                    request.append(s)
            if request:
                items["Goals and requests"].append(_clip(" ".join(request), 160))
        elif m.role == "assistant":
            items["Tool results"].extend(_tool_line(c) for c in m.tool_calls)
    lines = [HEADER]
    for section in SECTIONS:
        unique = list(dict.fromkeys(items[section]))           # dedupe, keep first occurrence order
        kept = unique[-CAPS[section]:]
        if kept:
            lines.append(f"{section}:")
            lines.extend(f"- {x}" for x in kept)
    topics = topics_of(messages) or old_topics
    if topics:
        lines.append(f"{TOPICS}: {', '.join(topics)}")
    return "\n".join(lines) if len(lines) > 1 else ""

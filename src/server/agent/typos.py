"""Typos of the metric words in an English ops request ("memroy", "dsik usage", "whats the netwrok
status"), corrected only where the message reads as an ops request otherwise (``corrected``): its other
words are ops words, or a cue word stands next to the typo. Real words ("risk", "statues", "stratus"), names
(a capitalised word that does not open the message: "Is Emory University in Atlanta?") and paths stay.
"""
from __future__ import annotations

import functools
import re

#: the metric words a typo is corrected to ("memroy", "dsik", "netwrok", "proccesses"; ``corrected``)
TYPO_WORDS = ("memory", "disk", "disks", "network", "process", "processes", "uptime", "storage", "bandwidth",
              "interfaces", "usage", "status", "swap", "load")
#: the shortest word a typo is corrected in; words of 4 letters only when two letters are swapped ("dsik")
TYPO_MIN_CHARS = 4
#: the shortest words a typo of two edits is corrected in, and then only when both edits swap letters
#: ("bnadwdith": the same letters as "bandwidth"), never two other edits ("progresses" is no "processes")
TYPO_TWO_EDITS_MIN_CHARS = 8
#: the longest message read as an ops request when all its other words are ops words (``corrected``)
TYPO_CONTEXT_MAX_WORDS = 12
_WORD = re.compile(rf"(?<![\w./\\-])[A-Za-z]{{{TYPO_MIN_CHARS},}}(?![\w./\\-])")
_ANY_WORD = re.compile(r"[A-Za-z][A-Za-z']*|\d+%?")
#: real words a typo correction must leave alone (one letter from a metric word: "risk" / "disk", "lead")
_REAL_WORDS = {"risk", "desk", "dusk", "dish", "lead", "loan", "road", "toad", "goad", "loads", "swan", "swam",
               "sway", "swat", "stats", "risks", "desks", "dusks", "disco", "statue", "statues", "stratus", "states",
               "usages", "storages", "stowage", "processor", "processed", "progress", "progresses", "memo", "memos",
               "emory", "network", "status", "loud", "lord", "upline", "uptime", "bandwidths"}
#: the words an ops request is made of besides its metric words ("whats the X usage", "show X", "check X", "X status",
#: "how much X is free"): a misspelled metric word is corrected only among them (``corrected``)
_OPS_WORDS = {"cpu", "cpus", "ram", "mem", "memory", "disk", "disks", "network", "swap", "load", "uptime", "storage",
              "bandwidth", "interfaces", "usage", "status", "process", "processes", "free", "used", "use", "space",
              "left", "full", "stats", "info", "utilization", "utilisation", "level", "percent", "%", "show", "check",
              "get", "display", "view", "see", "monitor", "list", "top", "what", "whats", "what's", "how", "much",
              "many", "is", "are", "the", "my", "me", "of", "on", "this", "server", "system", "machine", "box", "host",
              "current", "currently", "now", "right", "please", "and", "or", "a", "an", "tell", "give", "it", "its",
              "there", "available", "total", "high", "low", "ok", "okay", "fine", "in", "by", "sort", "sorted", "pls",
              "average", "avg", "quickly", "again", "overall", "report", "summary", "too", "also"}
#: the words next to a misspelled metric word that make it one, in a message of other words ("whats the memroy
#: usage on db-1 right now", "show me the dsik space of web-2"): before it (skipping ``_FILLER_WORDS``) or after it
_CUE_BEFORE = {"show", "check", "get", "display", "view", "monitor", "much", "whats", "what's", "how's", "hows", "top",
               "cpu", "ram", "memory", "disk", "network", "swap", "and", "sort", "by"}
_CUE_AFTER = {"usage", "use", "used", "status", "free", "space", "left", "full", "stats", "info", "utilization",
              "utilisation", "level", "percent", "%", "pressure", "and", "cpu", "ram", "memory", "disk", "network",
              "swap", "load", "uptime", "report", "looking", "by"}
_FILLER_WORDS = {"me", "the", "my", "current", "server", "system", "machine", "our", "your", "this", "is", "of"}
#: words of what a metric does that make a misspelled metric word one anywhere in its clause ("I think the memroy
#: on db-1 is leaking", "the dsik is spinning", "dsik almost full")
#: (what a metric is doing, never a noun: "memroy leaks in Java" is a topic, not a reading)
_OPS_VERBS = {"leaking", "spinning", "thrashing", "swapping", "filling", "full", "spiking", "growing", "exhausted",
              "failing", "degraded", "saturated", "congested", "dropping"}
#: a host (a name with a digit after "-" or ".": "db-1", "web01.internal"), a path or a value ("85%", "12GB") in the
#: clause of a misspelled metric word: it is one ("memroy on db-1")
_OPS_THING = re.compile(r"(?<![\w.-])(?:[A-Za-z][A-Za-z0-9]*(?:[-.][A-Za-z0-9]+)*[-.]\d[\w.-]*|/[\w./-]+|"
                        r"\d+(?:\.\d+)?\s*(?:%|[kmgt]i?b\b))", re.I)
#: where a clause ends, for ``_OPS_VERBS`` / ``_OPS_THING``
_CLAUSE_END = re.compile(r"[,;.!?]\s|\s+(?:and|but|or)\s+|[;!?]$", re.I)


def _ops_clause(text: str, start: int) -> bool:
    """The clause of ``text`` holding the word at ``start`` names a host, a path or a value, or an ops verb."""
    ends = [m for m in _CLAUSE_END.finditer(text)]
    lo = max([m.end() for m in ends if m.end() <= start], default=0)
    hi = min([m.start() for m in ends if m.start() >= start], default=len(text))
    clause = text[lo:hi]
    return _OPS_THING.search(clause) is not None or any(
        w.lower() in _OPS_VERBS for w in _ANY_WORD.findall(clause))


def _distance(a: str, b: str) -> int:
    """Edit distance with adjacent swaps (optimal string alignment), capped at 3."""
    if abs(len(a) - len(b)) > 2:
        return 3
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


@functools.lru_cache(maxsize=4096)
def typo_of(word: str) -> str | None:
    """The metric word (``TYPO_WORDS``) ``word`` misspells, or None: one edit (a letter added, dropped, changed
    or two swapped) in a word of ``TYPO_MIN_CHARS`` letters or more; two only when both words have
    ``TYPO_TWO_EDITS_MIN_CHARS`` letters or more and the edits swap letters (the same letters); a word of 4
    letters only when two letters are swapped ("dsik" -> "disk", never "risk"). Real words (``_REAL_WORDS``) stay."""
    low = word.lower()
    if len(low) < TYPO_MIN_CHARS or low in TYPO_WORDS or low in _REAL_WORDS or not low.isalpha():
        return None
    for target in TYPO_WORDS:
        same_letters = len(low) == len(target) and sorted(low) == sorted(target)
        if len(low) == 4 or len(target) == 4:
            if same_letters and _distance(low, target) == 1:
                return target
            continue
        distance = _distance(low, target)
        if distance == 1 or distance == 2 and same_letters and min(len(low), len(target)) >= TYPO_TWO_EDITS_MIN_CHARS:
            return target
    return None


def corrected(text: str) -> str:
    """``text`` with a misspelled metric word (``typo_of``) corrected, only where the message reads as an ops
    request otherwise: all its other words are ops words (``_OPS_WORDS``: "memroy", "dsik usage", "whats the
    memroy usage", "memroy and dsik"), or a cue word stands next to it ("show me the dsik space of web-2",
    "whats the memroy usage on db-1"). A capitalised word other than the first (a name: "Is Emory University
    in Atlanta?"), a path and a real word ("the statues in the lobby", "stratus clouds") stay."""
    words = [(m.start(), m.group(0)) for m in _ANY_WORD.finditer(text)]
    if not words:
        return text
    fixes: dict[int, str] = {}
    for m in _WORD.finditer(text):
        word = m.group(0)
        if word[0].isupper() and not word.isupper() and m.start() != words[0][0]:
            continue                                           # a name ("Emory"), not a sentence's first word
        target = typo_of(word)
        if target is not None:
            fixes[m.start()] = target
    if not fixes:
        return text
    lows = [w.lower() for _, w in words]
    at = {start: k for k, (start, _) in enumerate(words)}
    short = len(words) <= TYPO_CONTEXT_MAX_WORDS
    kept: dict[int, str] = {}
    for start, target in fixes.items():
        k = at.get(start)
        if k is None:
            continue
        others = [w for j, w in enumerate(lows) if j != k and words[j][0] not in fixes]
        if short and all(w in _OPS_WORDS or w[0].isdigit() for w in others):
            kept[start] = target
            continue
        j = k - 1
        while j >= 0 and lows[j] in _FILLER_WORDS:
            j -= 1
        before = lows[j] if j >= 0 else None
        after = lows[k + 1] if k + 1 < len(lows) else None
        if before in _CUE_BEFORE or after in _CUE_AFTER or _ops_clause(text, start):
            kept[start] = target
    if not kept:
        return text
    out, last = [], 0
    for start in sorted(kept):
        end = start + len(words[at[start]][1])
        out += [text[last:start], kept[start]]
        last = end
    return "".join(out) + text[last:]

"""The summary model's side of long-term memory: what of a user message it is sent, and what of its
answer is kept.

With a summary model configured, ``distill_by_model`` asks it (``DISTILL_PROMPT``) for the durable
facts and preferences of a message as JSON. It is sent only what the user states as true
(``model_source``: the rules' tests of ``server.memory.distill``, clause by clause), and of its answer
only items that pass the same tests and are said in the text it was sent are kept
(``model_items_kept``, ``grounded``); secrets never (``server.memory.sensitive``). When it fails or
answers something unusable, the rules' items are used (``SOURCE_RULES``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from server.memory.analyze import CJK_STOP_CHARS, STOPWORDS, analyze, normalize, word_terms
from server.memory.distill import (BILINGUAL_SUBJECT_WORDS, CONCEPT_OF, FOLDED, LANGUAGE_OF, LANGUAGES, MAX_ITEMS_PER_MESSAGE,
                                   MAX_STATEMENT_CHARS, PREFERENCE, clip, distill_rules, unstated, unstated_as)
from server.memory.extractive import sentences
from server.memory.sensitive import mentions_secret
from server.memory.stemmer import stem

log = logging.getLogger("nplt.memory")
DISTILL_PROMPT = (
    "Extract the durable facts and preferences the USER states about themselves, their work or their "
    "systems in the message below (names, hosts, paths, settings, how they want answers). Skip "
    "questions, one-off requests and anything uncertain; never include secrets such as passwords or "
    "keys. Word a fact as \"<what> is <value>\" when it has that shape (\"The prod DB host is "
    "db-prod-42\"), so a later correction replaces it. Answer with JSON only: a list of objects "
    "{\"kind\": \"fact\" or \"preference\", \"text\": \"one short sentence in the user's "
    "language\"}; [] when there is nothing durable.")


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
        if mentions_secret(d["text"]):
            continue
        out.append(("preference" if d.get("kind") == "preference" else "fact", clip(d["text"])))
    return out


#: ``distill_by_model``'s second value: which path produced the items (``MemoryItem.source``)
SOURCE_MODEL = "model"
SOURCE_RULES = "rules"


#: where ``model_source`` cuts a sentence into clauses: a Chinese comma, a semicolon, a colon (before a
#: space: not 02:30 nor http://) and an English comma before "but" ("I wonder why, but the host is db-1")
_SOURCE_CLAUSE = re.compile(r"\s*[，；;：]\s*|:\s+|,\s*(?=(?:but|yet|though|however)\b)", re.IGNORECASE)
#: a clause that turns from what the clause before said ("but ...", "但是…"): out of its scope
_CONTRAST = re.compile(r"^(?:but|yet|though|however|但是|但|不过|可是|然而|只是)(?:[\s,，]+|(?=[\u4e00-\u9fff]))",
                       re.IGNORECASE)
#: the separators after which a hedge, a conditional or hearsay no longer holds (a new clause of its
#: own: "Bob said the host is x; the port is 5432" states the port), unless ``_CONTRAST`` does it
_SCOPE_ENDS = frozenset(";；")


def _stated_clauses(sentence: str) -> list[str]:
    """The clauses of a sentence that does not end in a question mark that the user states as true
    (``_SOURCE_CLAUSE``, ``unstated_as``): a question or a request to be told drops only itself
    ("我不知道为什么，但是主库是 db-7。" keeps "主库是 db-7。", "How we deploy: the deploy host is
    deploy-3." keeps "The deploy host is deploy-3."); a conditional, a hedge or hearsay also drops the
    clauses after it up to a semicolon or a clause that turns from it ("but", 但是: "I wonder why, but
    the prod DB host is db-prod-44."), so "如果主库是 db-9，端口就是 5433。" and "老王说：主库是 db-7。"
    keep nothing. Every clause stated: the sentence as it is; a question ("…, is it db-1?"): []."""
    end = sentence.rstrip()[-1:]
    if end in ("?", "？"):
        return [] if unstated(sentence) else [sentence]
    parts, seps, at = [], [], 0
    for m in _SOURCE_CLAUSE.finditer(sentence):
        parts.append(sentence[at:m.start()])
        seps.append(m.group())
        at = m.end()
    parts.append(sentence[at:])
    kept: list[str] = []
    scoped = False
    for n, part in enumerate(parts):
        turned = _CONTRAST.match(part.strip())
        clause = part.strip()[turned.end():] if turned else part.strip()
        if n and (turned or seps[n - 1].strip() in _SCOPE_ENDS):
            scoped = False
        why = unstated_as(clause) if clause else "question"
        if why == "scope":
            scoped = True
        if why is None and not scoped:
            kept.append(clause)
    if len(kept) == len(parts):
        return [sentence]
    terminal = end if end in ".。!！" else ""
    out = []
    for clause in kept:
        clause = clause.rstrip(" ,，")
        if clause[-1:] not in ".。!！" and terminal:
            clause += terminal
        out.append(clause[0].upper() + clause[1:] if clause[:1].isascii() else clause)
    return out


def model_source(text: str) -> str:
    """What of a user message the summary model is asked to distill: its sentences without what the
    user does not state as true (``unstated``: "Is the staging host stage-9?", "If my DB host is
    db-9, ...", "I think the port is 5433", "Bob said the VPN gateway is vpn-x"), which the model
    would otherwise restate as facts; "" when none is left. A sentence is judged by its clauses
    (``_stated_clauses``): one that asks or hedges in passing keeps what it states ("I wonder why, but
    the prod DB host is db-prod-44." -> "The prod DB host is db-prod-44."). A sentence over
    ``MAX_STATEMENT_CHARS`` is not classified and is kept."""
    kept = [c for s in sentences(text) for c in ([s] if len(s) > MAX_STATEMENT_CHARS else _stated_clauses(s))]
    return "\n".join(kept)


#: a longer message is filtered for the model (``model_source``) in a worker thread, off the loop
INLINE_FILTER_CHARS = 4000


# -- the summary model's items: stated, and said in the text it was sent ---------------------------

#: words a model's item may hold that the text it was sent need not (``grounded``): function words
#: (the recall analyzer's stopwords, without the negations: "not" must be the user's) and the frame of
#: a statement or of a request about the answers ("The user prefers answers in Chinese")
_NEGATION_WORDS = frozenset(("not", "no", "nor", "never", "none", "nothing", "cannot", "dont", "don't", "doesn't",
                             "didn't", "isn't", "aren't", "wasn't", "weren't", "won't", "can't", "couldn't",
                             "shouldn't", "wouldn't", "hasn't", "haven't", "hadn't", "mustn't", "shan't"))
FRAME_WORDS = (STOPWORDS - _NEGATION_WORDS) | frozenset((
    "user", "user's", "users", "use", "uses", "using", "used", "prefer", "prefers", "preferred", "preference",
    "want", "wants", "please", "answer", "answers", "answered", "reply", "replies", "replied", "respond",
    "responds", "response", "responses", "language", "keep", "now", "currently", "called", "named", "located"))
_ZH_FRAME_WORDS = ("用户", "我们", "咱们", "请", "使用", "用", "回答", "回复", "答复", "偏好", "喜欢", "希望", "现在",
                   "目前", "叫", "为")
#: a lasting request in the text sent: a model's preference needs one or a preference by the rules
#: (``_asks_lasting``), and only then may its item say "always" or "以后"
_LASTING = re.compile(r"\b(?:always|never|from now on|going forward|in (?:the )?future|from here on|henceforth|"
                      r"every time|each time|by default|I(?:['’]d|\s+would)?\s+prefer)\b|"
                      r"以后|今后|往后|从现在起|从现在开始|总是|始终|永远|一律|每次|一直|默认", re.IGNORECASE)
_LASTING_WORDS = frozenset(("always", "forever", "henceforth", "default", "future"))
_ZH_LASTING_WORDS = ("以后", "今后", "往后", "总是", "始终", "永远", "一律", "每次", "一直", "默认")
#: a negation in the text sent: only then may an item hold one ("never", "不要")
_NEGATED = re.compile(r"\b(?:not|no|nor|never|none|nothing|cannot|dont|stop)\b|n['’]t\b|[不没别勿禁]", re.IGNORECASE)
_ZH_NEGATION_WORDS = ("不要", "不再", "不用", "从不", "不", "别", "勿", "禁止")
_HAN_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_NOT_HAN = rf"[^\W_{_HAN_CLASS}]"
#: an item's pieces: a run of Han characters, or a word or value of any other letters and digits
#: ("db-prod-42", "10.0.0.1:5432", "http://x.example/a.sh", "bob's")
_ITEM_PIECE = re.compile(rf"(?P<han>[{_HAN_CLASS}]+)|(?P<tok>{_NOT_HAN}(?:(?:{_NOT_HAN}|[_.:/@+#%&=?~'’-])*{_NOT_HAN})?)")
_PLAIN_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
_CONCEPT_BY_STEM = {stem(w): c for w, c in CONCEPT_OF.items() if w.isascii()}
_LANGUAGE_BY_STEM = {stem(n): language for n, language in LANGUAGE_OF.items() if n.isascii()}


class _Sent:
    """The text the model was sent, as ``grounded`` compares with it."""

    def __init__(self, source: str) -> None:
        self.text = normalize(source)
        self.terms = frozenset(analyze(source))
        self.negated = _NEGATED.search(self.text) is not None
        self.lasting = _LASTING.search(self.text) is not None
        self.prefers = any(p.search(self.text) for p in PREFERENCE)     # (a preference by the rules)
        self._han: set[str] = set()
        for concept, words in BILINGUAL_SUBJECT_WORDS.items():
            if any(self.says(w) for w in words):
                self._han.update(w for w in words if not w.isascii())
        for names in LANGUAGES.values():
            if any(self.says(n) for n in names):
                self._han.update(n for n in names if not n.isascii())
        self._han.update(_ZH_FRAME_WORDS)
        if self.lasting or self.prefers:
            self._han.update(_ZH_LASTING_WORDS)
        if self.negated:
            self._han.update(_ZH_NEGATION_WORDS)
        self._longest = max(map(len, self._han))

    def says(self, word: str) -> bool:
        """The word is in the text: an English word by its stem, a Chinese one as it is."""
        if word.isascii():
            return any(t in self.terms for t in word_terms(word.casefold()))
        return word in self.text

    def word(self, word: str) -> bool:
        """An item's word of letters (one part of a hyphenated one): a function or frame word, in the
        text by its stem, a negation or a lasting word when the text has one, or an ops noun or a
        language the text names in either language (``BILINGUAL_SUBJECT_WORDS``, ``LANGUAGES``)."""
        w = word.casefold().replace("’", "'")
        if w in _NEGATION_WORDS or w.endswith("n't"):
            return self.negated
        if w in FRAME_WORDS or self.says(w):
            return True
        if w in _LASTING_WORDS:
            return self.lasting or self.prefers
        w = w[:-2] if w.endswith("'s") else w
        concept = CONCEPT_OF.get(FOLDED.get(w, w)) or _CONCEPT_BY_STEM.get(stem(w))
        if concept is not None and any(self.says(x) for x in BILINGUAL_SUBJECT_WORDS[concept]):
            return True
        language = LANGUAGE_OF.get(w) or _LANGUAGE_BY_STEM.get(stem(w))
        return language is not None and any(self.says(n) for n in LANGUAGES[language])

    def value(self, token: str) -> bool:
        """A value (a digit or a sign in it: an identifier, number, host, path, URL) is in the text as it is."""
        return re.search(rf"(?<![^\W_]){re.escape(token.casefold())}(?![^\W_])", self.text) is not None

    def han(self, run: str) -> bool:
        """A run of Han characters is made of pieces of the text (two characters or more), Chinese
        words the text says in either language or in its frame (``_ZH_FRAME_WORDS``) and function
        characters (``CJK_STOP_CHARS``)."""
        reach = [False] * (len(run) + 1)
        reach[0] = True
        far = 0          # run[i:far] is in the text for every i < far - 1 (a piece's suffix is one too)
        for i in range(len(run)):
            if not reach[i]:
                continue
            if run[i] in CJK_STOP_CHARS:
                reach[i + 1] = True
            for n in range(1, min(self._longest, len(run) - i) + 1):
                if run[i:i + n] in self._han:
                    reach[i + n] = True
            for j in range(i + 2, far + 1):
                reach[j] = True
            j = max(i + 2, far + 1)          # (so each search of the text extends a piece or ends one)
            while j <= len(run) and run[i:j] in self.text:
                reach[j] = True
                far = j
                j += 1
        return reach[-1]


def grounded(text: str, source: str | _Sent) -> bool:
    """Every piece of a model's item is said in the text it was sent (``source``): each value (with a
    digit or a sign: "db-prod-42", "vpn-x.example.com", "http://..." ) as it is, each English word by its
    stem unless it is a function or frame word (``FRAME_WORDS``), a negation only when the text has
    one, an ops noun or a language named in either language ("The prod DB host is db-prod-42" from
    "生产数据库的主机是 db-prod-42"; "Answers in Chinese" from "…中文"), and each run of Chinese as pieces
    of the text (``_Sent.han``). A translation of other words ("Hangzhou" for 杭州) is not said."""
    sent = source if isinstance(source, _Sent) else _Sent(source)
    for m in _ITEM_PIECE.finditer(normalize(text)):
        if m.group("han"):
            if not sent.han(m.group("han")):
                return False
            continue
        token = m.group("tok")
        if _PLAIN_WORD.fullmatch(token):
            if not sent.word(token):
                return False
        elif all(_PLAIN_WORD.fullmatch(p) for p in token.split("-")) and "-" in token:
            if not sent.value(token) and not all(sent.word(p) for p in token.split("-")):
                return False
        elif not sent.value(token):
            return False
    return True


def _asks_lasting(sent: _Sent) -> bool:
    """The text sent asks for a lasting way of answering: a preference by the rules (``PREFERENCE``)
    or a lasting request ("from now on", "always", "以后", "I prefer": ``_LASTING``)."""
    return sent.lasting or sent.prefers


def model_items_kept(items: list[tuple[str, str]], source: str) -> list[tuple[str, str]]:
    """The model's items that the user stated, in the text it was sent (``source``, ``model_source``):
    an item is dropped when the rules do not take it as stated (``unstated``: a question, a
    conditional or hypothesis, a hedge, a request to check, hearsay), when a piece of it is not in
    the text (``grounded``: the model invented it, or an instruction pasted into the message made it
    up) or when it is a preference and the text asks for no lasting way of answering
    (``_asks_lasting``). How many were dropped is logged at INFO."""
    sent = _Sent(source)
    kept = [(kind, text) for kind, text in items
            if not unstated(text) and grounded(text, sent) and (kind != "preference" or _asks_lasting(sent))]
    if len(kept) < len(items):
        log.info("memory: %d of the summary model's %d items were dropped: not stated as true, or not said "
                 "in the message", len(items) - len(kept), len(items))
    return kept


async def distill_by_model(agent: Any, model: str | None, text: str) -> tuple[list[tuple[str, str]], str]:
    """Ask the summary model about what the message states (``model_source``): (its items,
    ``SOURCE_MODEL``); (the rules' items, ``SOURCE_RULES``) when it fails or answers something
    unusable, so an item says which path learned it. A message that states nothing (only questions,
    hypotheses, hedges, hearsay) is not sent: ([], ``SOURCE_RULES``)."""
    source = model_source(text) if len(text) <= INLINE_FILTER_CHARS else \
        await asyncio.to_thread(model_source, text)
    if not source.strip():
        return [], SOURCE_RULES
    try:
        answer = await agent.complete([{"role": "system", "content": DISTILL_PROMPT},
                                       {"role": "user", "content": source}], model)
    except Exception as exc:   # the provider failed (AgentError) or the agent has a bug: the rules still work
        log.warning("memory: distilling with the model failed (%s: %s); the rules are used instead",
                    type(exc).__name__, exc)
        return distill_rules(text), SOURCE_RULES
    parsed = parse_model_answer(answer or "")
    if parsed is None:
        log.info("memory: the model's distillation was not a JSON list of items; the rules are used instead")
        return distill_rules(text), SOURCE_RULES
    kept = model_items_kept(parsed, source) if len(source) <= INLINE_FILTER_CHARS else \
        await asyncio.to_thread(model_items_kept, parsed, source)
    return kept, SOURCE_MODEL


async def distill_with_model(agent: Any, model: str | None, text: str) -> list[tuple[str, str]]:
    """``distill_by_model``'s items alone (the model's, or the rules' when it fails or answers
    something unusable)."""
    return (await distill_by_model(agent, model, text))[0]

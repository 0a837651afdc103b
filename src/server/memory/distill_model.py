"""The summary model's side of long-term memory: what of a user message it is sent, and what of its
answer is kept.

With a summary model configured, ``distill_by_model`` asks it (``DISTILL_PROMPT``) for the durable
facts and preferences of a message as JSON. It is sent only what the user states as true
(``model_source``: the rules' tests of ``server.memory.distill``, clause by clause), and of its answer
only items that pass the same tests and are said in the text it was sent are kept
(``model_items_kept``, ``grounded``: values, names, negations and commands as they are, other words in
its own way up to ``MAX_UNSAID_WORDS`` neutral ones, ``NEUTRAL_UNSAID_WORDS``); secrets never (``server.memory.sensitive``). When it fails,
answers something unusable or none of its items is kept, the rules' items are used (``SOURCE_RULES``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import unicodedata
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
                             "shouldn't", "wouldn't", "hasn't", "haven't", "hadn't", "mustn't", "shan't", "ain't",
                             # (the same without the apostrophe, and other words that deny)
                             "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont", "cant", "couldnt",
                             "shouldnt", "wouldnt", "hasnt", "havent", "hadnt", "mustnt", "shant", "aint",
                             "neither", "nobody", "nowhere", "without"))
#: function words that turn what a statement says (off, down, out, against, was, ...): free in an item
#: only when the text has the very word ("TLS stays off" from "TLS is enabled" is dropped)
TURNING_WORDS = frozenset(("off", "down", "out", "against", "under", "over", "once", "few", "was", "were", "been",
                           "had", "except", "until", "before", "after"))
FRAME_WORDS = (STOPWORDS - _NEGATION_WORDS - TURNING_WORDS) | frozenset((
    "user", "user's", "users", "use", "uses", "using", "used", "prefer", "prefers", "preferred", "preference",
    "want", "wants", "please", "answer", "answers", "answered", "reply", "replies", "replied", "respond",
    "responds", "response", "responses", "language", "keep", "now", "currently", "called", "named", "located"))
_ZH_FRAME_WORDS = ("用户", "我们", "咱们", "请", "使用", "用", "回答", "回复", "答复", "偏好", "喜欢", "希望", "现在",
                   "目前", "叫", "为", "位于", "所在")
#: a lasting request in the text sent: a model's preference needs one or a preference by the rules
#: (``_asks_lasting``), and only then may its item say "always" or "以后"
_LASTING = re.compile(r"\b(?:always|never|from now on|going forward|in (?:the )?future|from here on|henceforth|"
                      r"every time|each time|by default|I(?:['’]d|\s+would)?\s+prefer)\b|"
                      r"以后|今后|往后|从现在起|从现在开始|总是|始终|永远|一律|每次|一直|默认", re.IGNORECASE)
_LASTING_WORDS = frozenset(("always", "forever", "henceforth", "default", "future"))
_ZH_LASTING_WORDS = ("以后", "今后", "往后", "总是", "始终", "永远", "一律", "每次", "一直", "默认")
#: a negation in the text sent: only then may an item hold one ("never", "不要")
_NEGATED = re.compile(r"\b(?:not|no|nor|never|none|nothing|cannot|dont|stop|neither|nobody|nowhere|without|aint|"
                      r"(?:does|did|is|are|was|were|wo|ca|could|should|would|has|have|had|must|sha)nt)\b|n['’]t\b|"
                      r"[不没别勿禁]", re.IGNORECASE)
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
        self.flat = " ".join(self.text.split())

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
        if w in TURNING_WORDS:
            return re.search(rf"(?<![^\W_]){w}(?![^\W_])", self.text) is not None
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

    def alias(self, word: str) -> bool:
        """Another name of one thing is in the text (``NAME_ALIASES``: "PostgreSQL" for "postgres")."""
        group = _ALIAS_OF.get(word.casefold())
        return group is not None and any(self.says(a) for a in group)

    def han(self, run: str, lenient: bool = False) -> tuple[int, int] | None:
        """A run of Han characters as (its words said, its words unsaid), or None when it holds a piece
        the text does not. Said: pieces of the text (two characters or more), Chinese words the text
        says in either language or in its frame (``_ZH_FRAME_WORDS``) and function characters
        (``CJK_STOP_CHARS``). ``lenient`` (not the value of a statement): also a single character of
        the text, and a run of other characters put between two characters (not function characters)
        the text has side by side ("主数据库" from "主库"), as one unsaid word per two characters; the
        fewest unsaid words win."""
        n = len(run)
        best: list[tuple[int, int] | None] = [None] * (n + 1)      # (unsaid, -said) to reach run[:i]
        best[0] = (0, 0)

        def offer(j: int, base: tuple[int, int], unsaid: int, said: int) -> None:
            cand, cur = (base[0] + unsaid, base[1] - said), best[j]
            if cur is None or cand < cur:
                best[j] = cand

        far = 0          # run[i:far] is in the text for every i < far - 1 (a piece's suffix is one too)
        for i in range(n):
            at = best[i]
            if at is None:
                continue
            if run[i] in CJK_STOP_CHARS:
                offer(i + 1, at, 0, 0)
            for k in range(1, min(self._longest, n - i) + 1):
                if run[i:i + k] in self._han:
                    offer(i + k, at, 0, 0 if run[i:i + k] in _ZH_FRAME_WORDS else 1)
            for j in range(i + 2, far + 1):
                offer(j, at, 0, 1)
            j = max(i + 2, far + 1)          # (so each search of the text extends a piece or ends one)
            while j <= n and run[i:j] in self.text:
                offer(j, at, 0, 1)
                far = j
                j += 1
            if not lenient:
                continue
            if run[i] in self.text:
                offer(i + 1, at, 0, 0)
            if i and run[i - 1] not in CJK_STOP_CHARS:     # (not after 的: "我们的上海数据库" adds a place)
                for j in range(i + 1, min(n - 1, i + 2 * MAX_UNSAID_WORDS) + 1):
                    if run[j - 1] in ZH_NEVER_UNSAID:       # (no 不, 停, 法 of its own: "以后不用中文回答")
                        break
                    if run[j] not in CJK_STOP_CHARS and run[i - 1] + run[j] in self.text:
                        offer(j, at, (j - i + 1) // 2, 0)
        end = best[n]
        return None if end is None else (-end[1], end[0])


#: how far a model's item may word what the text said its own way (``grounded``): at most this many
#: ordinary words the text did not say (an English word of small letters whose stem is not in the
#: text, "concise" for "short", "lives" for "based"; Chinese characters put between two the text
#: has side by side, one word per two characters) ...
MAX_UNSAID_WORDS = 2
#: ... each of them a neutral word of a rephrasing (by its stem): who or what a fact is about, the
#: plain verbs of a fact, how answers are worded, how often something runs. Never a word that denies,
#: turns or ends what the text said ("without", "isnt", "stopped", "disabled", "replaced", "left",
#: "decommissioned", "wipe", "format", ...) nor a language ("french"): they are not in this list, so
#: an item that adds one is dropped
NEUTRAL_UNSAID_WORDS = frozenset((
    "user", "team", "company", "organization", "org", "person", "people", "staff",
    "server", "host", "machine", "node", "instance", "service", "system", "port", "setup", "environment",
    "env", "config", "configuration", "setting", "value", "address", "name", "location", "place", "city",
    "office", "home", "tool", "app", "application", "project", "editor", "account", "member", "role", "job",
    "time", "zone", "timezone", "hosted", "belong", "work", "part",
    "use", "run", "has", "have", "live", "located", "based", "resides", "reside", "sits", "serve",
    "store", "hold", "contain", "include", "listen", "point", "resolve", "connect", "communicate", "rely",
    "set", "configured", "called", "named", "prefer", "like", "want", "wish", "ask", "request", "expect",
    "concise", "brief", "short", "terse", "succinct", "compact", "clear", "plain", "simple", "detailed",
    "nightly", "daily", "via", "within", "inside", "across", "per", "along", "around", "near",
    "toward", "towards", "upon", "onto", "among", "also", "currently", "usually", "typically", "generally"))
_NEUTRAL_STEMS = frozenset(stem(w) for w in NEUTRAL_UNSAID_WORDS)
#: Chinese characters never put into a run of the text as the model's own (``_Sent.han``): a negation
#: (不 没 别 勿 非 未 无 ...), a word that stops, removes, ends or replaces (停 删 关 禁 撤 废 ...), a
#: past or a former state (曾 旧 原 前) and the first character of a language name (法 英 德 ...)
ZH_NEVER_UNSAID = frozenset("不没别勿非未无莫否甭毋休停删关禁撤废弃拆卸退离移换迁除掉灭断坏错假曾旧原前"
                            + "".join(n[0] for names in LANGUAGES.values() for n in names if not n.isascii()))
#: ... and no more than this share of the words that count in each clause of the item (words the
#: text said and values; not function words nor the frame of a fact: "The user uses emacs" from
#: "I use vim" has one word of its own and none said, and is dropped)
MAX_UNSAID_SHARE = 0.5
#: names of one thing: one in the item is said when another is in the text
NAME_ALIASES: tuple[tuple[str, ...], ...] = (
    ("postgres", "postgresql", "psql", "pg"), ("kubernetes", "k8s", "kube"), ("mongodb", "mongo"),
    ("elasticsearch", "elastic"), ("javascript", "js"), ("typescript", "ts"), ("golang", "go"))
_ALIAS_OF = {name: group for group in NAME_ALIASES for name in group}
#: a shell command in an item (a downloader, sudo, rm, a shell, a pipe, "&&", "$(", a redirect to a
#: path): kept only when the item from there on is in the text as it is
COMMAND = re.compile(r"(?<![\w./-])(?:curl|wget|sudo|rm|chmod|chown|mkfs|dd|eval|exec|bash|sh|zsh|ksh|nc|ncat|"
                     r"netcat|powershell|pwsh|iex|invoke-expression)(?![\w/.-])|\||&&|\$\(|>>?\s*[/~]",
                     re.IGNORECASE)
#: where an item's clauses end: each is weighed on its own (``MAX_UNSAID_SHARE``)
_ITEM_CLAUSE = re.compile(r",\s+|[;，；、：]|:\s+|\s+(?:and|but|while|whereas|which|who|so)\s+|并且|而且|但是|以及|同时",
                          re.IGNORECASE)
#: what a statement says a thing is: the words after it in a clause are its value, said as they are
_COPULA = re.compile(r"\b(?:is|are|was|were|am|be|been|being)\b|位于|(?<![但还就总倒要若可于凡])是(?!否)|"
                     r"(?<![现正存实所自])在|(?<![因作认成称以更较])为(?!了)", re.IGNORECASE)
#: frame words that count as said words of a preference ("prefers concise answers"), not of a fact
_PREFERENCE_FRAME = frozenset(("prefer", "prefers", "preferred", "preference", "want", "wants", "answer", "answers",
                               "answered", "reply", "replies", "replied", "respond", "responds", "response",
                               "responses", "language"))
_HAN_CHAR = re.compile(f"[{_HAN_CLASS}]")


def _word(sent: _Sent, word: str, kind: str, lenient: bool) -> tuple[int, int] | None:
    """One word of letters of an item as (said, unsaid), None when it must be said and is not."""
    folded = word.casefold().replace("’", "'")
    if sent.word(word) or sent.alias(word):
        counted = folded not in FRAME_WORDS or (kind == "preference" and folded in _PREFERENCE_FRAME)
        return (1 if counted else 0), 0
    if (not lenient or folded != word or folded in _NEGATION_WORDS or folded.endswith("n't")
            or folded in _LASTING_WORDS or folded in TURNING_WORDS or COMMAND.fullmatch(folded)):
        return None          # (a name, a negation, "always", a command word, or in a value: never unsaid)
    if not _neutral(folded):
        return None          # (a word that turns what was said, a language: "without", "stopped", "french")
    return 0, 1


def _neutral(word: str) -> bool:
    """An ordinary word the model may add (``NEUTRAL_UNSAID_WORDS``, by its stem), never a language."""
    bare = word[:-2] if word.endswith("'s") else word
    if LANGUAGE_OF.get(bare) is not None or _LANGUAGE_BY_STEM.get(stem(bare)) is not None:
        return False
    return bare in NEUTRAL_UNSAID_WORDS or stem(bare) in _NEUTRAL_STEMS


def _tally(part: str, sent: _Sent, kind: str, lenient: bool, latin_names: bool) -> tuple[int, int] | None:
    """(said, unsaid) words of part of an item, None when a piece of it must be said and is not."""
    said = unsaid = 0
    for m in _ITEM_PIECE.finditer(part):
        got: tuple[int, int] | None
        if m.group("han"):
            got = sent.han(normalize(m.group("han")), lenient)
        else:
            token = m.group("tok")
            if _PLAIN_WORD.fullmatch(token):
                got = _word(sent, token, kind, lenient and not latin_names)
            elif "-" in token and all(_PLAIN_WORD.fullmatch(p) for p in token.split("-")):
                got = (1, 0)
                if not sent.value(token):                  # ("on-call" as "on" and "call")
                    pieces = [_word(sent, p, kind, lenient and not latin_names) for p in token.split("-")]
                    got = None if None in pieces else \
                        (sum(p[0] for p in pieces if p), sum(p[1] for p in pieces if p))
            else:
                got = (1, 0) if sent.value(token) or sent.alias(token) else None
        if got is None:
            return None
        said, unsaid = said + got[0], unsaid + got[1]
    return said, unsaid


def grounded(text: str, source: str | _Sent, kind: str = "fact") -> bool:
    """A model's item says what the text it was sent (``source``) said, in its own words at most a
    little (``MAX_UNSAID_WORDS``, ``MAX_UNSAID_SHARE``). Said as they are, always: each value (with a
    digit or a sign: "db-prod-42", "vpn-x.example.com", "http://...", "02:00"), each name (a word with
    a capital letter, or a Latin word in a Chinese item: "ArgoCD", "Berlin"; another name of one thing
    counts, ``NAME_ALIASES``), a negation (only when the text has one), "always"/"以后" (only when it
    asks for something lasting), a shell command (``COMMAND``: from there on, as it is in the text) and
    what a statement says a thing is (the words of a clause after "is"/"是"/"在"/"位于": "我们的数据库在上海"
    from "...在杭州" is dropped). Said by its stem, in either language for the ops nouns and languages
    ("The prod DB host is db-prod-42" from "生产数据库的主机是 db-prod-42"), or else counted as unsaid:
    an English word of small letters that is a neutral one (``NEUTRAL_UNSAID_WORDS``: "The team deploys
    with ArgoCD" from "We deploy with ArgoCD"; never "without", "stopped", "french": ``_neutral``); a
    turning function word ("off", "was": ``TURNING_WORDS``) only when the text has it.
    Chinese as pieces of the text (``_Sent.han``). A translation of a name ("Hangzhou" for 杭州) is
    not said."""
    sent = source if isinstance(source, _Sent) else _Sent(source)
    item = unicodedata.normalize("NFKC", text)
    command = COMMAND.search(item)
    if command is not None:
        rest = " ".join(normalize(item[command.start():]).split()).rstrip(" .。!！")
        if rest not in sent.flat:
            return False
    latin_names = _HAN_CHAR.search(item) is not None
    unsaid_in_all = 0
    for clause in _ITEM_CLAUSE.split(item):
        copula = _COPULA.search(clause)
        parts = [(clause, True)] if copula is None else [(clause[:copula.start()], True),
                                                         (clause[copula.start():], False)]
        said = unsaid = 0
        for part, lenient in parts:
            got = _tally(part, sent, kind, lenient, latin_names)
            if got is None:
                return False
            said, unsaid = said + got[0], unsaid + got[1]
        if unsaid > MAX_UNSAID_SHARE * (said + unsaid):
            return False
        unsaid_in_all += unsaid
    return unsaid_in_all <= MAX_UNSAID_WORDS


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
            if not unstated(text) and grounded(text, sent, kind)
            and (kind != "preference" or _asks_lasting(sent))]
    if len(kept) < len(items):
        log.info("memory: %d of the summary model's %d items were dropped: not stated as true, or not said "
                 "in the message", len(items) - len(kept), len(items))
    return kept


async def distill_by_model(agent: Any, model: str | None, text: str) -> tuple[list[tuple[str, str]], str]:
    """Ask the summary model about what the message states (``model_source``): (its items,
    ``SOURCE_MODEL``); (the rules' items, ``SOURCE_RULES``) when it fails, answers something
    unusable, or answers items none of which is kept (``model_items_kept``) while the rules learn
    something from the message, so an item says which path learned it and a stated fact is not lost. A message that states nothing (only questions,
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
    if parsed and not kept:          # (every item dropped: what the rules learn is not lost with them)
        rules = distill_rules(text) if len(text) <= INLINE_FILTER_CHARS else await asyncio.to_thread(distill_rules, text)
        if rules:
            log.info("memory: none of the summary model's items was kept; the rules' %d are used instead", len(rules))
            return rules, SOURCE_RULES
    return kept, SOURCE_MODEL


async def distill_with_model(agent: Any, model: str | None, text: str) -> list[tuple[str, str]]:
    """``distill_by_model``'s items alone (the model's, or the rules' when it fails or answers
    something unusable)."""
    return (await distill_by_model(agent, model, text))[0]

"""Episodic recall: one BM25 document per finished turn, searchable per session or across a user's
sessions, formatted as clearly marked excerpts for the prompt.

A turn document holds the user message and the final answer (weight 1), the neighbouring turns of
the same session as context (before: 0.6, 0.3; after: 0.4, 0.2 -- a reply only makes sense with
what it answers), and the turn's date (day, month name, year at 0.5) so "what did we do in May"
finds it. ``bench/locomo_recall.py`` measures this exact construction. A turn answered by a history
search listing (``metadata.history_listing``) is not indexed at all (``turn_docs``).

The neighbours' words make a turn found by what was said around it: right for the prompt's recall,
wrong for a listing of "earlier messages about X" (the history_search tool), which asks
``RecallIndex.search(..., own_match=True)``: only turns whose own text (or date) holds a query term.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Callable, Hashable, Iterable, Iterator

from server.memory.analyze import analyze
from server.memory.bm25 import ALL, BM25Index, GroupDrop
from server.memory.tokens import TokenCounter, splits_at_whitespace, truncate_to_tokens
from server.memory.when import referenced_days

BM25_K1 = 1.2
BM25_B = 0.5
WEIGHTS_BEFORE = (0.6, 0.3)      # the turn right before, two before
WEIGHTS_AFTER = (0.4, 0.2)
DATE_WEIGHT = 0.5
RRF_K = 60                       # reciprocal rank fusion constant
OWN_MATCH_DEPTH = 4              # own_match: ranked turns looked at per turn wanted (at least OWN_MATCH_MIN_DEPTH)
OWN_MATCH_MIN_DEPTH = 20
MAX_QUERY_CHARS = 2_000          # a longer query (a pasted log) is searched by its first and last 1,000 characters
EXCERPT_CHARS_PER_TOKEN = 8      # an excerpt of N tokens is cut from the first 8 * N characters of a text at most
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")


@dataclass(slots=True)
class TurnDoc:
    """One finished turn as the recall layer sees it."""
    session_id: str
    message_id: int              # the user message id (identifies the turn)
    answer_id: int | None        # the final assistant message id, if any
    time: str                    # ISO 8601 timestamp of the user message
    user_text: str
    answer_text: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.session_id, self.message_id)

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.message_id,) if self.answer_id is None else (self.message_id, self.answer_id)

    def text(self) -> str:
        return f"{self.user_text}\n{self.answer_text}" if self.answer_text else self.user_text


def parse_time(iso: str) -> datetime | None:
    """An ISO timestamp as an aware datetime (naive = UTC), None if unreadable."""
    try:
        dt = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


@lru_cache(maxsize=4096)
def _date_terms(iso: str) -> tuple[str, ...]:
    dt = parse_time(iso)
    return () if dt is None else tuple(analyze(f"{dt.day} {MONTHS[dt.month - 1]} {dt.year}"))


def date_terms(iso: str) -> list[str]:
    """Index terms of a timestamp: day, month name, year."""
    return list(_date_terms(iso))


def bounded_query(query: str) -> str:
    """``query``, or for one longer than ``MAX_QUERY_CHARS`` (a pasted log) its first and last
    ``MAX_QUERY_CHARS // 2`` characters: what is asked is at the start or the end, and a search
    never analyzes (nor walks the postings of) tens of thousands of characters."""
    if len(query) <= MAX_QUERY_CHARS:
        return query
    half = MAX_QUERY_CHARS // 2
    return f"{query[:half]}\n{query[-half:]}"


def query_terms(query: str, now: datetime | None = None) -> list[str]:
    """Analyzed query terms, plus the date terms of the days a relative time in it refers to
    ("yesterday", "last Tuesday", "上周二"; resolved against ``now``, see ``server.memory.when``).
    Only the ``bounded_query`` part of a very long query counts."""
    query = bounded_query(query)
    terms = analyze(query)
    if now is not None:
        extra: list[str] = []
        for day in referenced_days(query, now):
            for t in _date_terms(day.isoformat()):
                if t not in extra:
                    extra.append(t)
        terms.extend(extra)
    return terms


class QueryMatch:
    """Whether a text itself is about a query: it holds one of the query's analyzed words, or (for
    a query naming relative days: "yesterday", "last Tuesday") it is dated on one of those days.
    Neighbouring turns' words do not count (``RecallIndex.search(own_match=True)``, the offline
    agent's wording of history hits)."""

    def __init__(self, query: str, now: datetime | None = None) -> None:
        query = bounded_query(query)
        self.words = frozenset(analyze(query))
        self.days = [frozenset(_date_terms(day.isoformat())) for day in referenced_days(query, now)] \
            if now is not None else []

    def matches(self, terms: Iterable[str], time: str | None = None) -> bool:
        """``terms``: the text's analyzed words; ``time``: its ISO timestamp."""
        if not self.words.isdisjoint(terms):
            return True
        if self.days and time:
            dated = _date_terms(time)
            return any(day and day.issubset(dated) for day in self.days)
        return False

    def text_matches(self, text: str, time: str | None = None) -> bool:
        return self.matches(analyze(text), time)


def analyze_turns(docs: list[TurnDoc]) -> list[list[str]]:
    """``analyze`` of each turn's ``text()`` (pure CPU, no shared state: may run in a worker thread)."""
    return [analyze(doc.text()) for doc in docs]


def _add(bag: dict[str, float], terms: Iterable[str], weight: float) -> None:
    for t in terms:
        bag[t] = bag.get(t, 0.0) + weight


def own_and_before(own: list[str], before: list[list[str]]) -> dict[str, float]:
    """The first part of ``document_terms``: the document's own terms and those before it."""
    bag: dict[str, float] = {}
    _add(bag, own, 1.0)
    for terms, w in zip(before, WEIGHTS_BEFORE):
        _add(bag, terms, w)
    return bag


def document_terms(own: list[str], before: list[list[str]], after: list[list[str]],
                   dates: list[str]) -> dict[str, float]:
    """The weighted term bag of one document from analyzed parts (neighbours: nearest first)."""
    bag = own_and_before(own, before)
    for terms, w in zip(after, WEIGHTS_AFTER):
        _add(bag, terms, w)
    _add(bag, dates, DATE_WEIGHT)
    return bag


def rrf(rankings: list[list[Hashable]], k: int = RRF_K) -> list[tuple[Hashable, float]]:
    """Reciprocal rank fusion of several rankings (best first)."""
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + rank + 1)
    return sorted(scores.items(), key=lambda kv: -kv[1])


class RecallIndex:
    """The turn documents of one user, every session in one BM25 collection."""

    def __init__(self) -> None:
        self.bm25 = BM25Index(BM25_K1, BM25_B)
        self.docs: dict[tuple[str, int], TurnDoc] = {}
        self._terms: dict[tuple[str, int], list[str]] = {}          # analyzed text of each document
        # own_and_before() of the documents a new turn may still re-weight (the last len(WEIGHTS_AFTER)
        # of each session): appending turns never changes it, so a re-weight only adds what comes after
        self._heads: dict[tuple[str, int], dict[str, float]] = {}
        self._order: dict[str, list[tuple[str, int]]] = {}    # per session, by message id
        self._by_answer: dict[tuple[str, int], tuple[str, int]] = {}   # (session, answer id) -> key
        self.indexed_upto: dict[str, int] = {}                # highest message id consumed per session
        self.vectors: dict[tuple[str, int], list[float]] = {}  # optional embeddings

    def __len__(self) -> int:
        return len(self.docs)

    def _reindex(self, order: list[tuple[str, int]], i: int) -> int:
        """(Re-)index document ``i`` of a session: exactly ``document_terms`` of it and its neighbours.
        Returns the number of terms posted."""
        key = order[i]
        terms = self._terms
        head = self._heads.get(key)
        if head is None:
            before = [terms[order[j]] for j in range(i - 1, max(i - 1 - len(WEIGHTS_BEFORE), -1), -1)]
            head = own_and_before(terms[key], before)
        if i >= len(order) - len(WEIGHTS_AFTER):
            self._heads[key] = head
            bag = dict(head)                # the same insertion order and float sums as document_terms
        else:
            bag = self._heads.pop(key, None) or head   # never re-weighted again: no copy needed
        for j, w in zip(range(i + 1, min(i + 1 + len(WEIGHTS_AFTER), len(order))), WEIGHTS_AFTER):
            _add(bag, terms[order[j]], w)
        _add(bag, _date_terms(self.docs[key].time), DATE_WEIGHT)
        self.bm25.add(key, bag, key[0], owned=True)   # bag: a fresh dict of positive weights, not kept here
        return len(bag)

    def add_turns(self, session_id: str, docs: list[TurnDoc], upto: int,
                  terms: list[list[str]] | None = None) -> None:
        """Append finished turns of a session (ascending ids); ``upto`` = last message id consumed."""
        for _ in self.add_steps(session_id, docs, upto, terms):
            pass

    def add_steps(self, session_id: str, docs: list[TurnDoc], upto: int,
                  terms: list[list[str]] | None = None) -> Iterator[int]:
        """``add_turns`` one document at a time: after each document (re-)indexed it yields the
        number of terms it posted, so that the caller can let the event loop run in between (a
        search meanwhile finds the documents indexed so far). ``terms``: ``analyze`` of each doc's
        ``text()``, when the caller computed them already (off the event loop); else they are
        computed here, before the first step. Stops when the session is removed meanwhile
        (``remove_session``: what was added went with it). Closed before the end (the caller was
        cancelled), it drops the new documents not indexed yet: a later call adds them again.
        ``indexed_upto`` moves only at the end."""
        order = self._order.setdefault(session_id, [])
        start = len(order)
        for n, doc in enumerate(docs):
            if doc.key in self.docs:
                continue
            self.docs[doc.key] = doc
            self._terms[doc.key] = analyze(doc.text()) if terms is None else terms[n]
            if doc.answer_id is not None:
                self._by_answer[(session_id, doc.answer_id)] = doc.key
            order.append(doc.key)
        # earlier documents gain the new turns as "after" context
        first = max(0, start - len(WEIGHTS_AFTER)) if len(order) > start else start
        done = start
        try:
            for i in range(first, len(order)):
                posted = self._reindex(order, i)
                done = max(done, i + 1)
                yield posted
                if self._order.get(session_id) is not order:
                    return
        finally:
            if done < len(order) and self._order.get(session_id) is order:    # closed half-way
                for key in order[done:]:
                    self._drop(key)
                del order[done:]
        self.indexed_upto[session_id] = max(upto, self.indexed_upto.get(session_id, 0))

    def _drop(self, key: tuple[str, int]) -> None:
        """Forget a document here (its postings are the caller's business)."""
        doc = self.docs.pop(key, None)
        if doc is not None and doc.answer_id is not None:
            self._by_answer.pop((key[0], doc.answer_id), None)
        self._terms.pop(key, None)
        self._heads.pop(key, None)
        self.vectors.pop(key, None)

    def remove_session(self, session_id: str) -> None:
        """Forget a session, its postings included (``drop_session`` finished at once)."""
        self.drop_session(session_id).finish()

    def drop_session(self, session_id: str) -> GroupDrop:
        """Forget a session at once (searches no longer find it: O(its documents)); its postings go
        with the ``step``s of the drop returned (``BM25Index.drop_group``: one entry per distinct
        term of the session), which the caller runs, e.g. a few thousand terms at a time between
        yields to the event loop. Re-adding the session first finishes what is left of it."""
        keys = self._order.pop(session_id, [])
        for key in keys:
            self._drop(key)
        self.indexed_upto.pop(session_id, None)
        return self.bm25.drop_group(session_id, keys)

    def acceptor(self, session_id: str | None, exclude: Iterable[int]) -> Callable[[Hashable], bool]:
        """A filter on document keys: the session (None = any) and no message id in ``exclude``."""
        excluded = set(exclude)

        def accept(key: Hashable) -> bool:
            doc = self.docs.get(key)    # type: ignore[arg-type]
            if doc is None or (session_id is not None and doc.session_id != session_id):
                return False
            return not excluded.intersection(doc.ids)
        return accept

    def excluded_keys(self, session_id: str, exclude: Iterable[int]) -> set[tuple[str, int]]:
        """Keys of the session's documents holding a message id of ``exclude`` (as ``acceptor`` rejects)."""
        out = set()
        for mid in exclude:
            key = (session_id, mid)
            if key in self.docs:
                out.add(key)
            owner = self._by_answer.get(key)
            if owner is not None:
                out.add(owner)
        return out

    def has_candidates(self, session_id: str, exclude: Iterable[int]) -> bool:
        """True when some document of the session holds no message id of ``exclude``."""
        return self.bm25.group_size(session_id) > len(self.excluded_keys(session_id, exclude))

    def search(self, query: str, k: int, *, session_id: str | None = None, exclude: Iterable[int] = (),
               vector_ranking: list[Hashable] | None = None, now: datetime | None = None,
               own_match: bool = False) -> list[tuple[TurnDoc, float]]:
        """Top ``k`` turns for ``query``; ``exclude`` = message ids already in the prompt; ``now``:
        the time of the question, for relative times in it (``query_terms``).

        With ``vector_ranking`` (document keys by embedding similarity, see ``rank_vectors``) the
        BM25 ranking and it are fused by reciprocal rank fusion.

        ``own_match`` (the history_search tool): only turns whose own text or date holds a query
        term, not those found by their neighbours' words alone; the best ``OWN_MATCH_DEPTH * k``
        (at least ``OWN_MATCH_MIN_DEPTH``) turns are looked at to find ``k`` of them.
        """
        terms = query_terms(query, now)
        if not own_match:
            return self._ranked(terms, k, session_id, exclude, vector_ranking)
        match = QueryMatch(query, now)
        depth = max(k * OWN_MATCH_DEPTH, OWN_MATCH_MIN_DEPTH)
        hits = self._ranked(terms, depth, session_id, exclude, vector_ranking)
        return [(doc, score) for doc, score in hits if self.mentions(doc, match)][:k]

    def mentions(self, doc: TurnDoc, match: QueryMatch) -> bool:
        """Whether ``doc`` itself (its user message and answer, or its day), not its neighbours,
        is about the query of ``match``."""
        own = self._terms.get(doc.key)
        return match.matches(analyze(doc.text()) if own is None else own, doc.time)

    def _ranked(self, terms: list[str], k: int, session_id: str | None, exclude: Iterable[int],
                vector_ranking: list[Hashable] | None) -> list[tuple[TurnDoc, float]]:
        if not vector_ranking:
            if session_id is not None:          # one session: only its postings, exclusions by key
                ranked = self.bm25.search(terms, k, group=session_id,
                                          skip=self.excluded_keys(session_id, exclude))
            else:
                excluded = set(exclude)
                ranked = self.bm25.search(terms, k, self.acceptor(None, excluded) if excluded else None)
            return [(self.docs[key], score) for key, score in ranked]     # type: ignore[index]
        accept = self.acceptor(session_id, exclude)
        ranked = self.bm25.search(terms, max(k * 4, 20), accept,
                                  group=ALL if session_id is None else session_id)
        fused = rrf([[key for key, _ in ranked], [key for key in vector_ranking if accept(key)]])
        return [(self.docs[key], score) for key, score in fused[:k]]     # type: ignore[index]


def cosine(a: list[float], b: list[float]) -> float:
    num = sum(x * y for x, y in zip(a, b))
    den = (sum(x * x for x in a) ** 0.5) * (sum(y * y for y in b) ** 0.5)
    return num / den if den else 0.0


def rank_vectors(query_vector: list[float], items: list[tuple[Hashable, list[float]]], depth: int) -> list[Hashable]:
    """Keys of ``items`` by cosine similarity to the query (pure CPU: run it in a thread)."""
    scored = sorted(((cosine(query_vector, vec), key) for key, vec in items), key=lambda sv: -sv[0])
    return [key for _, key in scored[:depth]]


@lru_cache(maxsize=4096)
def format_time(iso: str) -> str:
    dt = parse_time(iso)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if dt else "unknown time"


def format_excerpt(doc: TurnDoc, counter: TokenCounter, max_tokens: int) -> str:
    """``[Recalled from 2026-11-20 10:15 UTC] User: ... / Assistant: ...`` within ``max_tokens``.

    The user text gets at least half of the room; a cut side ends with "…".
    """
    return excerpt_and_tokens(doc, counter, max_tokens)[0]


def excerpt_and_tokens(doc: TurnDoc, counter: TokenCounter, max_tokens: int) -> tuple[str, int]:
    """``format_excerpt`` and the tokens of its text (each distinct text is counted once). Only the
    first ``EXCERPT_CHARS_PER_TOKEN * max_tokens`` characters of a long text are looked at (and
    counted): a 32,000-character message is never counted to keep a few hundred tokens of it."""
    head = f"[Recalled from {format_time(doc.time)}] User: "
    limit = EXCERPT_CHARS_PER_TOKEN * max(max_tokens, 1)
    user, answer = " ".join(doc.user_text.split()), " ".join(doc.answer_text.split())
    cut_user, cut_answer = len(user) > limit, len(answer) > limit     # cut: ends with "…" whatever fits
    user, answer = user[:limit], answer[:limit]
    sep = " / Assistant: "
    n_user, n_answer, n_head, n_sep = counter.count(user), counter.count(answer), counter.count(head), counter.count(sep)
    additive = splits_at_whitespace(counter)   # head ends and sep starts with a space
    room = max_tokens - n_head - (n_sep if answer else 0)
    text = head
    for _ in range(4):                       # shrink until it fits (each cut adds a "…")
        u_room = room if not answer else max(room // 2, room - n_answer)
        u = truncate_to_tokens(counter, user, u_room - 1) + "…" if n_user > u_room or cut_user else user
        n_u = n_user if u is user else counter.count(u)
        text = head + u
        n = n_head + n_u
        if answer:
            a = answer if n_answer <= room - n_u and not cut_answer else \
                truncate_to_tokens(counter, answer, room - n_u - 1) + "…"
            text += sep + a
            n += n_sep + (n_answer if a is answer else counter.count(a))
        if not additive:
            n = counter.count(text)
        if n <= max_tokens:
            return text, n
        room -= n - max_tokens
    text = truncate_to_tokens(counter, text, max_tokens)
    return text, counter.count(text)


def snippet(doc: TurnDoc, limit: int = 240) -> str:
    """A one-line preview of a turn for search results."""
    text = " ".join(doc.user_text.split())
    if doc.answer_text:
        text += " / " + " ".join(doc.answer_text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def turn_docs(session_id: str, messages: list[Any], *, final: bool) -> tuple[list[TurnDoc], int]:
    """Finished turns of ``messages`` (ChatMessage, ascending) and the last message id they consume.

    A turn is a user message plus the following non-user messages; its answer is the last non-empty
    assistant content. The last turn counts as finished when it has an answer or ``final`` is set.
    """
    docs: list[TurnDoc] = []
    upto = 0
    current: list[Any] = []

    def close(group: list[Any], require_answer: bool) -> bool:
        user = group[0]
        answers = [m for m in group[1:] if m.role == "assistant" and m.content.strip()]
        if require_answer and not answers:
            return False
        if any(m.metadata.get("history_listing") for m in answers):
            # a history question answered with a listing of earlier messages (the offline agent marks
            # it): indexed, it would be found by every later search for the same thing, before the
            # messages it lists; the turn is consumed but not indexed
            return True
        # a canned reply (the offline agent's help text) answers the turn but says nothing about the
        # user's topic: recall indexes the question without it
        answers = [m for m in answers if not m.metadata.get("canned")]
        ans = answers[-1] if answers else None
        docs.append(TurnDoc(session_id, user.id, ans.id if ans else None, user.timestamp, user.content,
                            ans.content if ans else ""))
        return True

    for m in messages:
        if m.role == "user":
            if current:
                close(current, require_answer=False)
                upto = current[-1].id
            current = [m]
        elif current:
            current.append(m)
        else:
            upto = m.id                  # non-user messages before any user message: nothing to index
    if current and close(current, require_answer=not final):
        upto = current[-1].id
    return docs, upto

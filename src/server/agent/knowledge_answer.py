"""What a knowledge route answers: the offline agent's documents answer, and the citations an answer makes.

A knowledge answer quotes only passages that hold at least one key term of the question
(``key_terms``: no stopword, no word naming the documents, no word that only asks) and what it is
about (as in ``knowledge_route``'s rule 4: every name, else one of the rarest terms, ``Focus.rarest``); when none holds a key
term it says the documents have nothing about it, when some do but none what it is about, that
they have nothing about that ("nothing about “deployments”", 知识库里没有找到关于“Kafka”的内容。),
naming only what no passage found holds (held apart: "nothing that mentions both"); it follows what
the route decided (``Focus.decided``), and notes the names a quoted text lacks ("(The text quoted
does not mention “SSL”.)"). A
passage text is quoted once (a file uploaded twice); passages of one file uploaded several times
(one citation in one collection: a personal vpn.md and a group's vpn.md are two files) are quoted
the most recently uploaded first, each citation followed by its document's upload time; a group's
passage names its group ("(group ops)", "（群组 ops）").

The LLM agent decides by calling ``search_knowledge`` or not; ``record_model_route`` records that and
checks the citations its answer writes against the passages it was given: this turn's searches' and
those of earlier searches its prompt carried (``unverified_citations``).
Passages are quoted (Markdown block quotes with their citation), never followed.
"""
from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, Iterable

from server.agent.knowledge_route import (ANSWER_HEAD_EN, ANSWER_HEAD_ZH, CITATION, SUBJECTS, Route, beside_names,
                                          coverage, held_names, holds_the_rest, key_terms, names, reading_subjects,
                                          words_for)
from server.agent.transcript import UNREADABLE_TEXT, knowledge_results, parsed_result
from server.memory.analyze import STOPWORDS, analyze

QUOTE_TOP = 3
_CJK_CHAR = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
QUOTE_CHARS = 600


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
    out = {k: p.get(k) for k in ("citation", "doc_id", "name", "chunk_id", "location")}
    if p.get("collection"):
        out["collection"] = p["collection"]
    return out


def _document(p: dict[str, Any]) -> tuple[Any, Any]:
    """What names one file: its collection (``personal``, ``group:<name>``; a passage without one is
    taken to be of the same collection as any other) and citation. A personal vpn.md and the group's
    vpn.md are two files, never two versions of one."""
    return p.get("collection"), p.get("citation")


def _group(p: dict[str, Any]) -> str | None:
    coll = p.get("collection")
    return coll[len("group:"):] if isinstance(coll, str) and coll.startswith("group:") else None


def upload_times(call: Any) -> dict[str, str]:
    """{doc_id: uploaded_at} of the documents whose passages in ``call`` share a citation with a passage
    of another document of the same collection (an edited file uploaded again under its name); {} when
    none do. The times are the passages' own (``search_knowledge`` gives each its document's upload time)."""
    by_document: dict[Any, set[Any]] = {}
    times: dict[str, str] = {}
    for p in passages_of(call):
        by_document.setdefault(_document(p), set()).add(p.get("doc_id"))
        if isinstance(p.get("uploaded_at"), str):
            times[p["doc_id"]] = p["uploaded_at"]
    clashing = {d for ids in by_document.values() if len(ids) > 1 for d in ids}
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
    """``quoted`` with the passages of one file uploaded several times (one citation in one collection,
    ``_document``) next to each other where the first of them was, the most recently uploaded first."""
    by_document: dict[Any, list[dict[str, Any]]] = {}
    for p in quoted:
        by_document.setdefault(_document(p), []).append(p)
    return [p for same in by_document.values()
            for p in sorted(same, key=lambda p: uploaded.get(p.get("doc_id"), ""), reverse=True)]


def _source_line(p: dict[str, Any], uploaded: dict[str, str], newest: bool, zh: bool) -> str:
    """"— [name §location]", with the group of a group's document ("group ops") and, for a file of which
    several uploads are quoted, the upload time of this one ("uploaded 2026-11-27 13:09:41 UTC, the
    newest")."""
    line = f"— {p.get('citation', '')}"
    parts, group, when = [], _group(p), uploaded.get(p.get("doc_id"))
    if group:
        parts.append(f"群组 {group}" if zh else f"group {group}")
    if when:
        at = f"{when[:19].replace('T', ' ')} UTC"
        parts.append((f"上传于 {at}" if zh else f"uploaded {at}") + (("，最新" if zh else ", the newest") if newest else ""))
    if parts:
        line += f"（{'，'.join(parts)}）" if zh else f" ({', '.join(parts)})"
    return line


def _nothing(zh: bool, words: list[str] | None = None) -> str:
    """The documents have nothing about it (about ``words``, when some of what was asked is there)."""
    if not words:
        return "知识库里没有找到相关内容。" if zh else "I found nothing about that in your documents."
    if zh:
        return f"知识库里没有找到关于{'、'.join(f'“{w}”' for w in words)}的内容。"
    shown = [f"“{w}”" for w in words]
    return f"I found nothing about {', '.join(shown[:-1]) + ' or ' if len(shown) > 1 else ''}{shown[-1]} in your documents."


def _text(p: dict[str, Any]) -> str:
    """What a passage holds: its text and its citation (the file and its headings)."""
    return str(p.get("text", "")) + " " + str(p.get("citation", ""))


def _holds(p: dict[str, Any]) -> set[str]:
    return set(analyze(_text(p)))


def _has(p: dict[str, Any], word: str, named: dict[str, str]) -> bool:
    """The passage holds ``word``: a name of ``named`` as ``held_names`` says, another word by its terms."""
    if word in named.values():
        return word in held_names({t: w for t, w in named.items() if w == word}, _text(p))
    terms = {t for t in analyze(word)}
    return bool(terms) and terms <= _holds(p)


def _together(zh: bool, words: list[str]) -> str:
    """The documents hold each of ``words`` somewhere, but no passage holds them together."""
    if zh:
        return f"知识库里没有找到同时提到{'和'.join(f'“{w}”' for w in words)}的内容。"
    shown = [f"“{w}”" for w in words]
    both = "both " if len(shown) == 2 else "all of " if len(shown) > 2 else ""
    return f"I found nothing in your documents that mentions {both}{', '.join(shown[:-1]) + ' and ' if len(shown) > 1 else ''}" \
        f"{shown[-1]}."


def _not_mentioned(zh: bool, words: list[str]) -> str:
    """The note after quoted passages that do not hold ``words`` (names of the question)."""
    if zh:
        return f"（以上内容未提到{'、'.join(f'“{w}”' for w in words)}。）"
    shown = [f"“{w}”" for w in words]
    return f"(The text quoted does not mention {', '.join(shown[:-1]) + ' or ' if len(shown) > 1 else ''}{shown[-1]}.)"


def answer(call: Any, zh: bool, focus: str, uploaded: dict[str, str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The offline answer quoting the best passages, and the citations it carries. Only the passages
    holding one of ``focus``'s ``key_terms`` (the question's, or a follow-up's own) and what it is
    about are quoted: every name it names (``names``: SLA, Kafka, db-prod-01; ``held_names``: a piece
    of an identifier, the "db" of db-prod-01, is no "DB") or, naming none, one of its rarest terms
    (``Focus.rarest``). "and its port?" quotes the passage about the port, not the one the previous
    answer quoted again, and a passage that merely says "this page documents ..." or shares "payments"
    with "What is the SLA of the payments API?" is not quoted. What the route decided is followed
    (``Focus.decided``): "nothing" says the documents have nothing about what it found missing
    (``Focus.absent``; one a passage found holds is never named: that none holds them together, else
    the passages are judged as below), "quote" quotes the passage it judged (``Focus.best``) and notes
    the names it lacks. Else, no passage holding every name: one no passage found holds leaves only a
    passage holding everything else asked (``holds_the_rest``; none: "I found nothing about “SLA” in
    your documents.", naming only what no passage holds); with every name held somewhere, the passages
    holding the most of what was asked (``coverage``) are quoted, with a note of the names they lack.
    None holding a key term: the documents have nothing about it. A text is quoted once; passages of
    one file uploaded several times (``uploaded``: their upload times, ``upload_times``) are quoted the
    newest first, each with its upload time; a group's passage names its group. Of a question holding a
    reading against the documents, only passages holding what is read (``Focus.subjects``: "swap") are
    quoted."""
    uploaded = uploaded or {}
    found = passages_of(call)
    if not found and call.status != "success":
        return ("知识库检索失败。" if zh else "The document search failed."), []
    terms = key_terms(focus)
    if not terms:
        return ("请告诉我要在知识库里查找什么。" if zh else "Tell me what to look for in your documents."), []
    named, rarest = names(focus), set(getattr(focus, "rarest", ()))
    beside = set(getattr(focus, "beside", ()))       # (with names: one of these too, 超时 of "redis 连接超时怎么办")
    unknown = set(getattr(focus, "unknown", ()))
    decided, best = getattr(focus, "decided", ""), getattr(focus, "best", "")
    found = [p for p in found if terms & _holds(p)]
    subjects = set(getattr(focus, "subjects", ()))   # (a reading asked against the documents: about what is read)
    if subjects:
        found = [p for p in found if subjects & _holds(p)]
    if decided == "nothing" and getattr(focus, "absent", ()):
        absent = list(focus.absent)                  # type: ignore[attr-defined]
        held = {w for w in absent if any(_has(p, w, named) for p in found)}
        if not held:
            return _nothing(zh, absent), []
        unheld = [w for w in absent if w not in held]
        together = list(dict.fromkeys([*named.values(), *absent]))
        if named and any(all(_has(p, w, named) for w in together) for p in found):
            together += [w for w in words_for(focus, beside) if w not in together]   # (the names, not 超时 with them)
        if named and not any(all(_has(p, w, named) for w in together) for p in found):
            return (_nothing(zh, unheld) if unheld else _together(zh, together)), []
    if not found:                                    # (say what was asked about: "nothing about “OOM”")
        return _nothing(zh, [w for w in dict.fromkeys(named.values()) if w in unknown]
                        or list(dict.fromkeys(named.values())) or None), []
    note: list[str] = []
    if named:
        every = list(dict.fromkeys(named.values()))
        about = [p for p in found if set(every) <= held_names(named, _text(p)) and (not beside or beside & _holds(p))]
        if not about:
            nowhere = [w for w in every if not any(_has(p, w, named) for p in found)]
            chosen = [p for p in found if p.get("citation") == best] if decided == "quote" else []
            if chosen:       # (a passage holding every name and more of the question first: "nginx 监听哪个端口？")
                more = beside_names(focus, named)
                about = [p for p in found if set(every) <= held_names(named, _text(p)) and more & _holds(p)] or chosen
            elif nowhere:                            # (a name no passage found holds: the rest, or nothing)
                about = [p for p in found if holds_the_rest(focus, named, nowhere, _text(p))]
                if not about:
                    return _nothing(zh, [w for w in nowhere if w in unknown] or nowhere), []
            else:                                    # (each name somewhere: the passages holding the most)
                most = max(coverage(focus, named, _text(p)) for p in found)
                about = [p for p in found if coverage(focus, named, _text(p)) == most]
            held_by = set().union(*(held_names(named, _text(p)) for p in about))
            note = [w for w in every if w not in held_by]
    else:
        about = [p for p in found if rarest & _holds(p)] if rarest else found
        if not about:
            seen = set().union(*map(_holds, found))
            return _nothing(zh, words_for(focus, rarest - seen) or None), []
    found = _distinct(about, uploaded)
    top = found[0].get("score") or 0
    quoted = [p for p in found[:QUOTE_TOP] if (p.get("score") or 0) >= 0.5 * top] or found[:1]
    documents = [_document(p) for p in quoted]
    dated = {p["doc_id"]: uploaded[p["doc_id"]] for p in quoted
             if documents.count(_document(p)) > 1 and p.get("doc_id") in uploaded}
    quoted = _newest_first(quoted, dated)
    parts = [ANSWER_HEAD_ZH if zh else ANSWER_HEAD_EN]
    for n, p in enumerate(quoted):
        text = str(p.get("text", ""))
        if len(text) > QUOTE_CHARS:
            text = text[:QUOTE_CHARS] + "…"
        block = "\n".join("> " + line if line.strip() else ">" for line in text.splitlines())
        newest = n == 0 or _document(quoted[n - 1]) != _document(p)
        parts.append(f"{block}\n\n{_source_line(p, dated, newest, zh)}")
    if note:
        parts.append(_not_mentioned(zh, note))
    return "\n\n".join(parts), [cite(p) for p in quoted]


#: the page or line part at the end of a written location (", p. 4", ", line 7", ", lines 7-9"; a
#: dash or en dash between the lines; ``_location``)
_WRITTEN_TAIL = re.compile(r"(?:^|,)\s*(?:p\.\s*(\d+)|lines?\s+(\d+)(?:\s*[-\u2013]\s*(\d+))?)\s*$", re.IGNORECASE)
#: what separates the headings of a location ("Ops > Restore")
_HEADING_SEP = re.compile(r"\s+>\s+")


def _plain(text: str) -> str:
    """``text`` as compared: NFC, spaces collapsed."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def _location(loc: str) -> tuple[list[str], int | None, tuple[int, int] | None] | None:
    """(headings, page, (first, last) line) of a location as a citation writes it ("Ops > Restore, p. 3,
    lines 10-24"; ``chunker.format_location``): the page and lines peeled off its end, the rest split at
    " > "; None when it writes a page or the lines twice, or a range that runs backwards."""
    page: int | None = None
    lines: tuple[int, int] | None = None
    loc = loc.strip()
    while loc and (m := _WRITTEN_TAIL.search(loc)):
        if m.group(1) is not None:
            if page is not None:
                return None
            page = int(m.group(1))
        else:
            if lines is not None:
                return None
            first = int(m.group(2))
            lines = (first, int(m.group(3)) if m.group(3) is not None else first)
            if lines[0] > lines[1]:
                return None
        loc = loc[:m.start()].rstrip()
    headings = [h for h in _HEADING_SEP.split(loc) if h] if loc else []
    return headings, page, lines


def _passage_location(passage: Any) -> tuple[str, list[str], int | None, tuple[int, int] | None] | None:
    """(name, headings, page, lines) of a passage: of its ``name`` and ``location`` record
    (``search_knowledge``'s) when it has them, else of its citation string (a passage given as one)."""
    if isinstance(passage, dict):
        name, loc = passage.get("name"), passage.get("location")
        if isinstance(name, str) and isinstance(loc, dict):
            heading, page, lines = loc.get("heading") or [], loc.get("page"), loc.get("lines")
            if (isinstance(heading, list) and all(isinstance(h, str) for h in heading)
                    and (page is None or type(page) is int)
                    and (not lines or (isinstance(lines, list) and len(lines) == 2
                                       and all(type(x) is int for x in lines)))):
                return name, list(heading), page, (lines[0], lines[1]) if lines else None
        passage = passage.get("citation")
    if not isinstance(passage, str) or not passage.startswith("[") or not passage.endswith("]"):
        return None
    name, sep, loc = passage[1:-1].partition(" §")
    parsed = _location(loc) if sep else None
    return (name, *parsed) if parsed is not None else None


def _cited(written: str, passage: Any) -> bool:
    """The citation ``written`` in an answer names ``passage`` (a ``search_knowledge`` passage, or its
    citation string "[name §location]"): the same citation, or the same file (its name as written,
    case and all: "Runbook.md" and "runbook.md" are two documents) and a location inside the passage's:
    its headings those of the passage from the top ("Ops", "Ops > Restore") or from the last one up
    ("Restore"; whole headings, compared ignoring case and spacing), its page the passage's, its line or
    lines inside the passage's ("line 13" or "lines 12-13" for "lines 12-14"), and at least one of them
    written. A different file, a heading not in the path, another page or a line outside the range is
    another passage."""
    citation = passage.get("citation") if isinstance(passage, dict) else passage
    if isinstance(citation, str) and written == citation:
        return True
    of = _passage_location(passage)
    w_name, sep, w_loc = written[1:-1].partition(" §")
    if of is None or not sep or _plain(w_name) != _plain(of[0]):
        return False
    mine = _location(w_loc)
    if mine is None:
        return False
    (w_heads, w_page, w_lines), (_, heads, page, lines) = mine, of
    if not (w_heads or w_page is not None or w_lines):
        return False
    w_heads, heads = [_plain(h).casefold() for h in w_heads], [_plain(h).casefold() for h in heads]
    n = len(w_heads)
    if n and (n > len(heads) or (w_heads != heads[:n] and w_heads != heads[-n:])):
        return False
    if w_page is not None and w_page != page:
        return False
    return not w_lines or (lines is not None and lines[0] <= w_lines[0] and w_lines[1] <= lines[1])


def carried_passages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The passages of the ``search_knowledge`` results a prompt carries (earlier turns' searches, as
    ``transcript.history_to_openai`` replays them): each ``tool`` message answering a search_knowledge
    call of the assistant message before it, whole (a result cut to fit the window is no longer JSON and
    counts for nothing). Stubs of documents the user can no longer read (``UNREADABLE_TEXT``,
    ``transcript.readable_history``) are left out."""
    messages = list(messages)
    out: list[dict[str, Any]] = []
    for i in knowledge_results(messages):
        parsed = parsed_result(messages[i]["content"])
        if parsed is not None:
            out.extend(p for p in parsed[1] if isinstance(p, dict) and isinstance(p.get("citation"), str)
                       and p.get("text") != UNREADABLE_TEXT)
    return out


def _key(p: dict[str, Any]) -> Any:
    """What one passage is (its chunk id; without one, its document and citation)."""
    chunk = p.get("chunk_id")
    return ("chunk", chunk) if chunk is not None else (p.get("doc_id"), p.get("collection"), p.get("citation"))


def record_model_route(context: dict[str, Any], metadata: dict[str, Any], calls: list[Any], content: str,
                       carried: Iterable[dict[str, Any]] = ()) -> None:
    """The LLM agent's route (did it search the documents?) and the citations its answer makes,
    checked (``_cited``) against the passages the model was given: those of this turn's searches
    (``calls``) and those of earlier searches its prompt carried (``carried``: the built context's
    messages; ``carried_passages``). ``metadata["citations"]``: the passages the answer cites, whichever
    turn found them (none cited: none stored, whatever was retrieved: the tool calls keep that);
    ``metadata["unverified_citations"]``: the ``[name §location]`` citations it writes that none of
    those passages has (a made-up "[vendor-secrets.pdf §p. 4]", or one of a document deleted since: its
    replayed passages are stubs), also noted in the route's reason and ``unverified_citations``."""
    if any(c.tool_name == "search_knowledge" for c in calls):
        route = Route("knowledge", "model_tool_call", "the model called search_knowledge").record()
    else:
        route = Route("general", "model", "the model answered without searching the documents").record()
    written = list(dict.fromkeys(CITATION.findall(content)))
    if written:
        seen: set[Any] = set()
        given = [p for p in [*(p for c in calls for p in passages_of(c)), *carried_passages(carried)]
                 if not (_key(p) in seen or seen.add(_key(p)))]     # this turn's copy of a passage first
        used = [p for p in given if any(_cited(w, p) for w in written)]
        unverified = [w for w in written if not any(_cited(w, p) for p in given)]
        if used:
            metadata["citations"] = [cite(p) for p in used]
        if unverified:
            metadata["unverified_citations"] = unverified
            route["unverified_citations"] = unverified
            route["reason"] += (f"; the answer cites {' '.join(unverified)}, which no passage of this turn's "
                                "searches or of the earlier ones its prompt carried has")
    context["route"] = route


#: a value a quoted sentence states: a number that is no part of a name, a time or a version (db-7,
#: 02:30, 1.2.3), with what follows it (``_quoted_values``: "%" or a unit word)
_VALUE = re.compile(r"(?<![\w.:/-])(\d+(?:\.\d+)?)(?![\w:/-]|\.\d)(\s*(?:%|percent\b|[^\W\d_]+))?", re.IGNORECASE)
#: the sentences of a quoted passage
_SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
#: what each reading subject is called in a comparison ("No comparison was made for swap: ...")
SUBJECT_NAMES = {"disk": ("the disk", "磁盘"), "memory": ("memory", "内存"), "swap": ("swap", "交换分区"),
                 "cpu": ("the CPU", "CPU"), "load": ("the load average", "系统负载")}


def _unit(after: str | None) -> str:
    """The unit of a quoted number from what follows it: "%" ("85%", "90 percent"), "" (none: "load
    above 8 for ..."), else the word ("10 minutes", "14 days": never compared with a reading)."""
    word = (after or "").strip().lower()
    if word in ("%", "percent"):
        return "%"
    return "" if not word or word in STOPWORDS else word


def _quoted_values(passages: list[dict[str, Any]]) -> list[tuple[str, float, str, set[str]]]:
    """(number as written, value, unit, the reading subjects it is about) of each number of the quoted
    ``passages``: a sentence is about the subjects it names (``knowledge_route.SUBJECTS``: "swap" of "If
    swap usage is above 50% ..."), one naming none about those its passage's headings name ("At 95% the
    on-call engineer must page the storage team." under "Disk runbook > Thresholds")."""
    every = {name: {t for t in analyze(words) if not _CJK_CHAR.match(t) or len(t) == 2}
             for subjects in SUBJECTS.values() for name, words in subjects.items()}
    out = []
    for p in passages:
        heading = " ".join(h for h in (p.get("location") or {}).get("heading", []) if isinstance(h, str)) \
            if isinstance(p.get("location"), dict) else ""
        by_heading = {name for name, terms in every.items() if terms & set(analyze(heading))}
        for sentence in _SENTENCE_BREAK.split(str(p.get("text", ""))):
            said = set(analyze(sentence))
            about = {name for name, terms in every.items() if terms & said} or by_heading
            for m in _VALUE.finditer(sentence):
                unit = _unit(m.group(2))
                out.append((m.group(1) + ("%" if unit == "%" else ""), float(m.group(1)), unit, about))
    return out


def _readings(call: Any) -> list[tuple[str, float | None, str, str]]:
    """(label, value, unit, subject) of what a ``sys_monitor`` call read: each filesystem's use (%),
    memory and swap use (%; swap None when the machine has none), CPU use (%), the 1-minute load (no
    unit). A failed call reads nothing."""
    if call.tool_name != "sys_monitor" or call.status != "success":
        return []
    try:
        doc = json.loads(call.result)
    except ValueError:
        return []
    metric = doc.get("metric") if isinstance(doc, dict) else None
    data = doc.get(metric) if isinstance(metric, str) else None
    if not isinstance(data, dict):
        return []
    if metric == "disk":
        return [(str(fs.get("mount")), float(fs["percent"]), "%", "disk")
                for fs in data.get("filesystems", []) if isinstance(fs, dict) and fs.get("percent") is not None]
    if metric == "memory":
        swap = data.get("swap") if isinstance(data.get("swap"), dict) else {}
        return [("memory", float(data["percent"]), "%", "memory"),
                ("swap", None if swap.get("total") in (None, "0 B") else float(swap["percent"]), "%", "swap")]
    if metric == "cpu":
        return [("CPU", float(data["percent"]), "%", "cpu")]
    if metric == "load":
        return [("load (1 min)", float(data["load_1m"]), "", "load")]
    return []


def _number(value: float) -> str:
    return f"{value:g}"


def compare_readings(search: Any, citations: list[dict[str, Any]], calls: list[Any], text: str,
                     readings: Iterable[str], zh: bool) -> str:
    """Whether each reading the question asks about (``knowledge_route.reading_subjects``: the swap of "is
    swap usage above the limit in the runbook?") is above, at or below the values the quoted passages
    (``citations`` of ``search``'s) state about it, when both are plain numbers of the same unit ("/ is at
    43.2%: below 85% and 95%."); else that no comparison was made, and why (no reading, no such value)."""
    wanted = reading_subjects(text, readings)
    cited = {(c.get("chunk_id"), c.get("citation")) for c in citations}
    quoted = [p for p in passages_of(search) if (p.get("chunk_id"), p.get("citation")) in cited]
    if not quoted:
        return "未做比较：没有引用知识库的内容。" if zh else "No comparison was made: nothing was quoted from your documents."
    values = _quoted_values(quoted)
    taken = [r for c in calls for r in _readings(c)]
    lines: list[str] = []
    for subject in wanted:
        name = SUBJECT_NAMES.get(subject, (subject, subject))[1 if zh else 0]
        mine = [r for r in taken if r[3] == subject]
        if not mine:
            lines.append(f"未做比较：没有读到{name}的数值。" if zh else f"No comparison was made for {name}: it was not read.")
            continue
        if all(r[1] is None for r in mine):
            lines.append(f"未做比较：这台机器没有{name}。" if zh else f"No comparison was made for {name}: this machine has none.")
            continue
        parts = []
        for label, value, unit, _ in mine:
            if value is None:
                continue
            against = sorted({(v, shown) for shown, v, u, about in values if subject in about and u == unit})
            if not against:
                continue
            above = [shown for v, shown in against if value > v]
            at = [shown for v, shown in against if value == v]
            below = [shown for v, shown in against if value < v]
            now = f"{_number(value)}{unit}"
            if zh:
                rel = "，".join(f"{word} {'、'.join(vs)}" for word, vs in (("高于", above), ("等于", at), ("低于", below)) if vs)
                parts.append(f"{label} 当前 {now}，{rel}")
            else:
                rel = ", ".join(f"{word} {' and '.join(vs)}" for word, vs in (("above", above), ("at", at), ("below", below)) if vs)
                parts.append(f"{label} is at {now}: {rel}")
        if parts:
            lines.append(("与引用的内容比较：" + "；".join(parts) + "。") if zh else
                         ("Compared with the text quoted: " + "; ".join(parts) + "."))
        else:
            unit = "%" if any(r[2] == "%" for r in mine) else ""
            kind = ("百分比" if unit else "数值") if zh else ("value in %" if unit else "plain number")
            lines.append(f"未做比较：引用的内容里没有关于{name}的{kind}。" if zh else
                         f"No comparison was made for {name}: the text quoted states no {kind} about it.")
    return "\n".join(lines)

"""The TUI shows citations an answer writes that match no passage it was given (metadata
``unverified_citations``) as not found in the user's documents, never as sources (review s33,
fixer "kbpassages"); the "why this answer" view says so too, and counts replayed passages of
documents deleted since."""
from __future__ import annotations

from textual.widgets import Button, Label

from client.tui.citations import UNVERIFIED_LABEL, CitationList, has_sources, unverified_of
from client.tui.why import why_lines
from client_testlib import chat, wait_until
from fake_client import FakeClient
from protocol.server_events import AnswerDelta, TurnEnd, TurnStart
from tui_script import answer, scripted_app, user

CITES = [{"citation": "[runbook.md §Restore]", "doc_id": "d1", "name": "runbook.md", "chunk_id": "c1"}]
MADE_UP = "[vendor-secrets.pdf §p. 4]"


def _label_texts(view) -> list[str]:
    return [str(lbl.render()) for lbl in view.query(Label)]


async def test_an_answer_with_a_made_up_citation_shows_it_as_not_found() -> None:
    fake = FakeClient(messages={"s1": [user(1, "timeout?"), answer(2, f"300 s [runbook.md §Restore] {MADE_UP}",
                                                                   citations=CITES,
                                                                   unverified_citations=[MADE_UP])]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        sources = chat(app).by_id[2].query_one(CitationList)
        assert [str(b.label) for b in sources.query(Button)] == ["[runbook.md §Restore]"]   # only real passages
        texts = _label_texts(sources)
        assert "Sources:" in texts and f"{UNVERIFIED_LABEL} {MADE_UP}" in texts


async def test_an_answer_citing_only_what_matches_nothing_shows_no_sources() -> None:
    fake = FakeClient(messages={"s1": [user(1, "secrets?"), answer(2, f"See {MADE_UP}.",
                                                                   unverified_citations=[MADE_UP, MADE_UP])]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        sources = chat(app).by_id[2].query_one(CitationList)
        assert not sources.query(Button)
        assert _label_texts(sources) == [f"{UNVERIFIED_LABEL} {MADE_UP}"]       # once, and no "Sources:"


async def test_a_live_answer_settles_with_its_unverified_citations() -> None:
    fake = FakeClient(messages={"s1": []})
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(1, "secrets?"), "fake"), AnswerDelta("s1", "t1", "See ", 0))
        await wait_until(lambda: any(m.content == "See " for m in chat(app).messages()), pilot=pilot,
                         what="the streamed text")
        settled = answer(2, f"See {MADE_UP}.", unverified_citations=[MADE_UP])
        await fake.push(TurnEnd("s1", "t1", settled, {}, "stop", {}))
        await wait_until(lambda: 2 in chat(app).by_id and bool(chat(app).by_id[2].query(CitationList)),
                         pilot=pilot, what="the settled answer's sources")
        assert _label_texts(chat(app).by_id[2].query_one(CitationList)) == [f"{UNVERIFIED_LABEL} {MADE_UP}"]


def test_unverified_citations_are_read_leniently() -> None:
    meta = {"unverified_citations": [MADE_UP, {"citation": "[x.md §y]"}, 3, "", MADE_UP]}
    assert unverified_of(meta) == [MADE_UP, "[x.md §y]"]
    assert unverified_of({"unverified_citations": "not a list"}) == [] and unverified_of({}) == []
    assert has_sources(meta) and has_sources({"citations": CITES}) and not has_sources({"citations": []})


def test_why_this_answer_names_unverified_citations_and_forgotten_passages() -> None:
    meta = {"unverified_citations": [MADE_UP],
            "context": {"pipeline": {"recall": {"unreadable_passages": 2}}, "turns_kept": 1}}
    lines = why_lines(meta)
    assert f"Citations {UNVERIFIED_LABEL} {MADE_UP}" in lines
    assert "Earlier passages of documents deleted or no longer readable: 2 (left out)" in lines
    plain = why_lines({"context": {"pipeline": {"recall": {}}, "turns_kept": 1}})
    assert not any(UNVERIFIED_LABEL in line or "no longer readable" in line for line in plain)


def test_the_error_line_of_a_failed_answer_says_its_attempts_once():
    """The TUI's error line (``message.error_text``) is nplt-client history's: a server message that
    already ends with "(after 4 attempts)" does not get a second one (before: "... (after 4 attempts)
    (after 4 attempts)")."""
    from client.tui.message import error_text
    meta = {"error": "LLM_ERROR", "attempts": 4,
            "error_message": "the model endpoint 127.0.0.1:1 returned HTTP 500: scripted failure (after 4 attempts)"}
    assert error_text(meta) == f"Error LLM_ERROR: {meta['error_message']}"
    assert error_text({"error": "LLM_ERROR", "attempts": 2, "error_message": "down"}) == \
        "Error LLM_ERROR: down (after 2 attempts)"
    assert error_text({}) is None

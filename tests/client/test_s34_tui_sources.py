"""Review s34 of the TUI's Sources under an answer: they were one row that never wrapped, so a long
label pushed its "(group NAME)" and the later sources past the edge, where Tab still focused them.
Now they go one per line when they do not fit, each label cut in the middle, its group kept."""
from __future__ import annotations

from textual.widgets import Button

from client.tui.citations import SOURCE_LABEL_CELLS, CitationList, fitted_label
from client_testlib import chat, wait_until
from fake_client import FakeClient
from tui_script import answer, scripted_app, user

LONG = "[" + "very-long-operations-runbook-name-" * 4 + ".md §Restoring the primary database]"
CITES = [{"citation": LONG, "name": "a.md", "chunk_id": "c1", "collection": "group:dev-team"},
         {"citation": "[short.md §x]", "name": "short.md", "chunk_id": "c2", "collection": "user:alice"},
         {"citation": "[nginx.conf L12-20]", "name": "nginx.conf", "chunk_id": "c3", "collection": "group:ops"}]


def test_a_fitted_label_cuts_the_middle_and_keeps_the_group() -> None:
    label = fitted_label(CITES[0])
    assert len(label) <= SOURCE_LABEL_CELLS and label.endswith(" (group dev-team)") and "…" in label
    assert label.startswith("[very-long") and "database]" in label
    assert fitted_label(CITES[2]) == "[nginx.conf L12-20] (group ops)"          # short: whole
    narrow = fitted_label(CITES[0], 30)
    assert len(narrow) <= 30 and narrow.endswith(" (group dev-team)")
    odd = fitted_label({"citation": "x" * 80, "chunk_id": "c", "collection": "group:" + "g" * 80}, 40)
    assert len(odd) <= 40 and odd.startswith("x") and "(group g" in odd and odd.endswith("g)")


async def test_sources_that_do_not_fit_go_one_per_line_with_their_groups() -> None:
    fake = FakeClient(messages={"s1": [user(1, "restore?"), answer(2, "See the runbook.", citations=CITES)]})
    async with scripted_app(fake, size=(80, 40)) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        sources = chat(app).by_id[2].query_one(CitationList)
        await wait_until(lambda: sources.styles.layout is not None and sources.styles.layout.name == "vertical",
                         pilot=pilot, what="one source per line")
        await pilot.pause()
        buttons = list(sources.query(".citation").results(Button))
        labels = [str(b.label) for b in buttons]
        assert labels[0].endswith("(group dev-team)") and labels[2] == "[nginx.conf L12-20] (group ops)"
        edge = sources.content_region.right
        assert all(b.region.width > 0 and b.region.right <= edge for b in buttons), \
            [(str(b.label), b.region) for b in buttons]
        assert len({b.region.y for b in buttons}) == 3          # one per line
        buttons[0].press()       # the passage is asked for by its chunk id, with the whole label
        await wait_until(lambda: ("KB_PASSAGE", {"chunk_id": "c1"}) in fake.calls, pilot=pilot,
                         what="the passage asked for")


async def test_sources_that_fit_stay_on_one_line() -> None:
    fake = FakeClient(messages={"s1": [user(1, "q"), answer(2, "a", citations=CITES[1:])]})
    async with scripted_app(fake, size=(110, 40)) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        sources = chat(app).by_id[2].query_one(CitationList)
        await pilot.pause()
        buttons = list(sources.query(".citation").results(Button))
        assert len({b.region.y for b in buttons}) == 1
        assert [str(b.label) for b in buttons] == ["[short.md §x]", "[nginx.conf L12-20] (group ops)"]

"""The TUI's sources under an answer name a group document's collection (review s34, groups): a
personal and a group document of one name showed as two identical buttons."""
from __future__ import annotations

from textual.widgets import Button

from client.tui.citations import CitationList, source_label
from client_testlib import chat, wait_until
from fake_client import FakeClient
from tui_script import answer, scripted_app, user

CITE = "[ops-runbook.md §Ops runbook > Backup, line 5]"
CITES = [{"citation": CITE, "doc_id": "a1", "name": "ops-runbook.md", "chunk_id": "a1:0", "collection": "group:ops"},
         {"citation": CITE, "doc_id": "b2", "name": "ops-runbook.md", "chunk_id": "b2:0", "collection": "personal"}]


async def test_a_group_source_and_a_personal_one_of_the_same_name_are_told_apart() -> None:
    fake = FakeClient(messages={"s1": [user(1, "backup passphrase?"), answer(2, "From your documents: ...",
                                                                             citations=CITES)]})
    async with scripted_app(fake) as (app, pilot):
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the history")
        sources = chat(app).by_id[2].query_one(CitationList)
        assert [str(b.label) for b in sources.query(Button)] == [f"{CITE} (group ops)", CITE]


def test_a_source_without_a_collection_keeps_its_citation() -> None:
    assert source_label({"citation": CITE, "chunk_id": "c"}) == CITE
    assert source_label({"name": "x.md", "chunk_id": "c", "collection": "group:"}) == "x.md"
    assert source_label({"chunk_id": "c9", "collection": "group:dev"}) == "c9 (group dev)"

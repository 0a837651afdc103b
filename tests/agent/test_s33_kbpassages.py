"""search_knowledge passages name their collection, and a replayed result forgets documents the
user can no longer read (review s33, fixer "kbpassages").

1. A personal ``vpn.md`` and the group's ``vpn.md`` share a citation: each passage says its
   collection (``personal`` / ``group:<name>``) and the note keeps "the newest upload is the
   current version" within one collection.
2. After a group document is deleted, the next turn of the same session replays the earlier
   search_knowledge result with that document's passages stubbed (``UNREADABLE_TEXT``): its text is
   not in the request the model gets.
"""
from __future__ import annotations

import json

import orjson

from protocol import MsgType
from server.agent import transcript
from server.agent.transcript import UNREADABLE_CUT_NOTE, UNREADABLE_TEXT, stub_unreadable
from server.knowledge import KnowledgeBase, KnowledgeConfig
from server.memory.context import WINDOW_CUT_NOTE
from server.tools.knowledge import QUOTED_NOTE, KnowledgeSource
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec

from kb_wire.kbwire import chat, connect, raw_upload, wired_server

PERSONAL_VPN = b"# VPN\n\nMy home VPN listens on port 51820 (WireGuard).\n"
TEAM_VPN = b"# VPN\n\nThe team VPN listens on port 1194 (OpenVPN).\n"
CREDS = b"# Break-glass\n\nThe break-glass admin account is bg-admin with passphrase Tundra-Falcon-42.\n"
KEPT = b"# Break-glass procedure\n\nUse the break-glass account only during an incident, with a ticket.\n"


def _section(llm: ScriptedLLM) -> dict:
    return {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0, "retries": 0}


def _tool_results(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "tool"]


# -- 1. collections --------------------------------------------------------------------------------
async def test_same_named_personal_and_group_passages_name_their_collection(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=_section(llm), summarization={"enabled": False}) as (srv, addr):
            alice, carol = await connect(addr, "alice"), await connect(addr, "carol")
            team = (await raw_upload(carol, "vpn.md", TEAM_VPN, collection="red"))["document"]
            mine = (await raw_upload(alice, "vpn.md", PERSONAL_VPN))["document"]     # newer, personal
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "VPN port", "top_k": 5}')),
                     Reply.text("The team VPN uses 1194 [vpn.md §VPN]; your own uses 51820 [vpn.md §VPN]."))
            await chat(alice, "which port does the VPN use?")
            [tool_msg] = _tool_results(llm.requests[-1].body)
            result = json.loads(tool_msg["content"])
            by_doc = {p["doc_id"]: p for p in result["passages"]}
            assert by_doc[team["doc_id"]]["collection"] == "group:red"
            assert by_doc[mine["doc_id"]]["collection"] == "personal"
            # the citation itself is unchanged: both read [vpn.md §VPN...]
            assert by_doc[team["doc_id"]]["citation"] == by_doc[mine["doc_id"]]["citation"]
            note = result["note"]
            assert note == QUOTED_NOTE
            assert "different collections are different documents" in note
            assert "Within one collection" in note and "newest upload" in note
            # the tool's description (sent with every request) says the same
            [tool] = [t for t in llm.requests[-1].body["tools"] if t["function"]["name"] == "search_knowledge"]
            assert "different collections are different documents" in tool["function"]["description"]
            await alice.close()
            await carol.close()


# -- 2. a deleted document leaves the replayed history ----------------------------------------------
async def test_a_deleted_group_document_is_stubbed_in_the_next_request(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=_section(llm), summarization={"enabled": False}) as (srv, addr):
            # server.services wires readable_history around the recall step
            assert getattr(dict(srv.services.runner.pipeline.steps)["recall"], "forgets_unreadable", False)
            alice, carol = await connect(addr, "alice"), await connect(addr, "carol")
            gone = (await raw_upload(carol, "creds-note.md", CREDS, collection="red"))["document"]
            kept = (await raw_upload(carol, "procedure.md", KEPT, collection="red"))["document"]
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "break-glass account"}')),
                     Reply.text("It is bg-admin [creds-note.md §Break-glass]."))
            await chat(alice, "what is the break-glass account?")
            first = _tool_results(llm.requests[-1].body)[0]["content"]
            assert "Tundra-Falcon-42" in first and "during an incident" in first     # both documents found

            await carol.call(MsgType.KB_DELETE, doc_id=gone["doc_id"])
            llm.push(Reply.text("That document is no longer available."))
            end, _ = await chat(alice, "and its passphrase?")
            body = llm.requests[-1].body
            assert "Tundra-Falcon-42" not in json.dumps(body)
            [replayed] = _tool_results(body)
            assert replayed["tool_call_id"] == "c1"          # still paired with its call
            passages = {p["doc_id"]: p for p in json.loads(replayed["content"])["passages"]}
            assert passages[gone["doc_id"]]["text"] == UNREADABLE_TEXT
            assert passages[gone["doc_id"]]["citation"].startswith("[creds-note.md")
            assert "during an incident" in passages[kept["doc_id"]]["text"]   # still readable: whole
            assert end["context"]["pipeline"]["recall"]["unreadable_passages"] == 1

            # the stored tool result is unchanged (the history keeps what the turn saw)
            page = await alice.call(MsgType.HISTORY_REQUEST)
            stored = [c["result"] for m in page["messages"] for c in m.get("tool_calls") or ()]
            assert any("Tundra-Falcon-42" in r for r in stored)
            await alice.close()
            await carol.close()


# -- the stubbing on its own -----------------------------------------------------------------------
def _exchange(result: str, call_id: str = "c1", name: str = "search_knowledge") -> list[dict]:
    return [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": "a"}]


def _result(*docs: tuple[str, str]) -> str:
    return orjson.dumps({"query": "q", "note": QUOTED_NOTE, "passages": [
        {"citation": f"[{d}.md §x]", "name": f"{d}.md", "collection": "group:red", "location": {},
         "chunk_id": f"{d}:0", "doc_id": d, "uploaded_at": None, "score": 1.0, "text": text} for d, text in docs]}).decode()


def test_a_result_cut_to_fit_that_names_an_unreadable_document_is_replaced_whole():
    whole = _result(("d1", "secret one " * 50), ("d2", "kept two"))
    head = whole.index("secret one") + 40                  # d1's passage is cut inside its text
    cut = whole[:head] + "\n" + WINDOW_CUT_NOTE.format(n=len(whole) - head)      # as the assembler cuts it
    messages = _exchange(cut)
    original = messages[2]
    assert transcript.replayed_doc_ids(messages) == {"d1"}
    assert stub_unreadable(messages, {"d2"}) == 1
    doc = json.loads(messages[2]["content"])
    assert doc == {"note": UNREADABLE_CUT_NOTE, "passages": [{"doc_id": "d1", "text": UNREADABLE_TEXT}]}
    assert messages[2]["tool_call_id"] == "c1" and original["content"] == cut   # a new dict: the cached one stays


def test_only_search_knowledge_results_are_touched():
    other = _exchange(_result(("d1", "x")), name="read_file")
    error = _exchange('{"error":"FORBIDDEN: no access"}')
    readable = _exchange(_result(("d1", "x")))
    for messages in (other, error, readable):
        before = [dict(m) for m in messages]
        assert stub_unreadable(messages, {"d1"} if messages is readable else set()) == 0
        assert messages == before


async def test_readable_doc_ids_follow_deletes_and_group_membership(tmp_path):
    kb = KnowledgeBase(KnowledgeConfig(), tmp_path / "kb")
    await kb.start()
    try:
        groups = {"alice": ("red",), "carol": ("red",)}
        source = KnowledgeSource(kb, lambda u: groups[u])
        own = await kb.ingest("alice", groups["alice"], None, "mine.md", KEPT)
        team = await kb.ingest("carol", groups["carol"], "red", "team.md", TEAM_VPN)
        doomed = await kb.ingest("carol", groups["carol"], "red", "creds.md", CREDS)
        ids = {own.doc_id, team.doc_id, doomed.doc_id}
        assert await source.readable_doc_ids("alice", ids) == ids
        await kb.delete("carol", groups["carol"], doomed.doc_id)
        assert await source.readable_doc_ids("alice", ids) == {own.doc_id, team.doc_id}
        groups["alice"] = ()                                        # alice left group red
        assert await source.readable_doc_ids("alice", ids) == {own.doc_id}
        assert await source.readable_doc_ids("alice", {"no-such-id"}) == set()
    finally:
        await kb.close()

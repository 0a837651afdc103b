"""Citation checking accepts the citations a model may rightly write (review s33, fixer cite2), over a
real server on loopback TCP with a scripted OpenAI-compatible endpoint, and in unit tests:

1. a follow-up the model answers without searching again, citing a passage of the previous turn
   (replayed in its prompt), stores that passage as its citation and flags nothing; the same citation
   in a new session (whose prompt carries no search) or after the document was deleted (its replayed
   passages are stubs) stays unverified;
2. a written citation names a passage when it is the same file and a location inside the passage's:
   a line or line range inside its lines, its page, its headings from the top or from the last one up
   ("[runbook.md §Backup]" for "[runbook.md §Database operations runbook > Backup, lines 7-9]"); a
   different file, a heading not in the path, another page or a line outside the range stays
   unverified.
"""
from __future__ import annotations

import orjson

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from server.agent import knowledge_answer
from server.agent.transcript import UNREADABLE_TEXT
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec

RUNBOOK = b"""# Database operations runbook

This runbook covers the PostgreSQL clusters of the payments platform.

## Backup

The nightly backup runs at 02:30 UTC from the host bk-3.internal using pgBackRest.
Full backups are kept on disk for 14 days; incremental backups for 7 days.
Restores from a backup are rehearsed every quarter.

## Environments

### Production

The production primary is db-prod-01 on port 5432. The replica is db-prod-02.
"""
SEARCH = ToolCallSpec("c1", "search_knowledge", '{"query": "nightly backup time"}')


def llm_section(llm: ScriptedLLM) -> dict:
    return {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0, "retries": 0}


def cited(end: dict) -> list[str]:
    return [x["citation"] for x in end["message"]["metadata"].get("citations", [])]


# -- 1. a follow-up citing the passage its prompt carries ------------------------------------------------
async def test_a_follow_up_citing_the_previous_turns_passage_is_verified_only_while_its_prompt_carries_it(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=llm_section(llm), summarization={"enabled": False}) as (srv, addr):
            c = await connect(addr, "alice")
            await raw_upload(c, "runbook.md", RUNBOOK)
            llm.push(Reply.tools(SEARCH), Reply.text("It runs at 02:30 UTC."))
            end, _ = await chat(c, "what time does the nightly backup run?")
            [result] = [orjson.loads(t["result"]) for t in end["message"]["tool_calls"]]
            [backup] = [p["citation"] for p in result["passages"] if "Backup" in p["citation"]]
            assert backup == "[runbook.md §Database operations runbook > Backup, lines 7-9]"

            llm.push(Reply.text(f"As quoted above, full backups are kept 14 days {backup}."))
            end, _ = await chat(c, "and how long are they kept?")
            meta, route = end["message"]["metadata"], end["context"]["route"]
            assert not end["message"]["tool_calls"] and route["method"] == "model"
            # the request carried the previous turn's search result: that is what the citation is checked against
            assert any(m.get("role") == "tool" and backup in m.get("content", "")
                       for m in llm.requests[-1].body["messages"])
            assert cited(end) == [backup]
            assert "unverified_citations" not in meta and "unverified_citations" not in route
            md = (await c.call(MsgType.HISTORY_EXPORT, format="markdown"))["content"]
            assert [line for line in md.splitlines() if line.startswith("Sources:")] == [f"Sources: {backup}"]

            await c.call(MsgType.SESSION_NEW)             # a new session: its prompt carries no search
            llm.push(Reply.text(f"Full backups are kept 14 days {backup}."))
            end, _ = await chat(c, "how long are full backups kept?")
            assert "citations" not in end["message"]["metadata"]
            assert end["message"]["metadata"]["unverified_citations"] == [backup]
            assert backup in end["context"]["route"]["reason"]

            await c.call(MsgType.SESSION_NEW)             # the document deleted: its replayed passages are stubs
            llm.push(Reply.tools(SEARCH), Reply.text("It runs at 02:30 UTC."))
            await chat(c, "what time does the nightly backup run?")
            assert (await c.call(MsgType.KB_DELETE, doc_id=result["passages"][0]["doc_id"]))["deleted"] is True
            llm.push(Reply.text(f"Full backups are kept 14 days {backup}."))
            end, _ = await chat(c, "and how long are they kept?")
            assert any(m.get("role") == "tool" and UNREADABLE_TEXT in m.get("content", "")
                       for m in llm.requests[-1].body["messages"])
            assert "citations" not in end["message"]["metadata"]
            assert end["message"]["metadata"]["unverified_citations"] == [backup]
            await c.close()


# -- 2. a location inside the passage's --------------------------------------------------------------
async def test_a_line_inside_the_range_or_the_last_heading_cites_the_passage_and_made_up_ones_do_not(tmp_path):
    backup = "[runbook.md §Database operations runbook > Backup, lines 7-9]"
    right = ["[runbook.md §Database operations runbook > Backup, line 7]", "[runbook.md §Backup]",
             "[runbook.md §backup, lines 8-9]", "[runbook.md § Database operations runbook > Backup]"]
    wrong = ["[other.md §Backup]", "[runbook.md §Restore]", "[runbook.md §Database operations runbook > Backup, line 12]",
             "[runbook.md §Backup, lines 6-8]", "[Runbook.md §Backup]"]
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=llm_section(llm), summarization={"enabled": False}) as (srv, addr):
            c = await connect(addr, "alice")
            await raw_upload(c, "runbook.md", RUNBOOK)
            for written in right + wrong:
                await c.call(MsgType.SESSION_NEW)
                llm.push(Reply.tools(SEARCH), Reply.text(f"The nightly backup runs at 02:30 UTC {written}."))
                end, _ = await chat(c, "what time does the nightly backup run?")
                meta = end["message"]["metadata"]
                if written in right:
                    assert cited(end) == [backup] and "unverified_citations" not in meta, written
                else:
                    assert "citations" not in meta and meta["unverified_citations"] == [written], written
                    assert end["context"]["route"]["unverified_citations"] == [written]
            await c.close()


def test_a_written_location_inside_the_passages_cites_it():
    passage = {"citation": "[runbook.md §Ops > Restore > Steps, p. 3, lines 12-14]", "name": "runbook.md",
               "location": {"heading": ["Ops", "Restore", "Steps"], "page": 3, "lines": [12, 14]}}
    for written in ("[runbook.md §Ops > Restore > Steps, p. 3, lines 12-14]",    # the same
                    "[runbook.md §Ops > Restore]", "[runbook.md §Ops]",           # from the top
                    "[runbook.md §Steps]", "[runbook.md §Restore > Steps]",       # from the last heading up
                    "[runbook.md §Steps, line 13]", "[runbook.md §Steps, lines 12-14]", "[runbook.md §Steps, lines 13–14]",
                    "[runbook.md §p. 3]", "[runbook.md §p. 3, line 12]", "[runbook.md §lines 12-13]",
                    "[runbook.md §ops  >  RESTORE]"):
        assert knowledge_answer._cited(written, passage), written
        assert knowledge_answer._cited(written, passage["citation"]), written      # the citation string alone
    for written in ("[other.md §Ops > Restore]", "[runbook.md §Ops > Backup]", "[runbook.md §Restore]",
                    "[runbook.md §Op]", "[runbook.md §Ops > Restore > Steps > More]", "[runbook.md §Steps, line 15]",
                    "[runbook.md §Steps, lines 11-12]", "[runbook.md §Steps, lines 14-12]", "[runbook.md §p. 4]",
                    "[runbook.md §Steps, p. 3, p. 3]", "[RUNBOOK.md §Steps]", "[runbook.md §start]"):
        assert not knowledge_answer._cited(written, passage), written
        assert not knowledge_answer._cited(written, passage["citation"]), written
    no_lines = {"citation": "[a.pdf §p. 2]", "name": "a.pdf", "location": {"page": 2}}
    assert knowledge_answer._cited("[a.pdf §p. 2]", no_lines)
    assert not knowledge_answer._cited("[a.pdf §p. 2, line 1]", no_lines)
    assert not knowledge_answer._cited("[a.pdf §Intro]", no_lines)


def test_the_passages_a_prompt_carries_are_the_whole_search_results_without_stubs():
    kept = {"citation": "[a.md §A, line 1]", "doc_id": "d1", "chunk_id": "d1:0", "text": "alpha"}
    stub = {"citation": "[b.md §B, line 1]", "doc_id": "d2", "chunk_id": "d2:0", "text": UNREADABLE_TEXT}
    other = {"citation": "[c.md §C, line 1]", "doc_id": "d3", "chunk_id": "d3:0", "text": "gamma"}

    def step(call_id: str, name: str, result: str) -> list[dict]:
        return [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call_id, "content": result}]
    messages = [{"role": "user", "content": "q"},
                *step("c1", "search_knowledge", orjson.dumps({"passages": [kept, stub]}).decode()),
                *step("c1", "read_file", orjson.dumps({"passages": [other]}).decode()),    # not a search result
                *step("c2", "search_knowledge", '{"passages": [{"citation": "[c.md §C, li'),   # cut to fit
                {"role": "assistant", "content": f"see {other['citation']}"}]                 # an answer is no source
    assert knowledge_answer.carried_passages(messages) == [kept]

    context: dict = {}
    metadata: dict = {}
    knowledge_answer.record_model_route(context, metadata, [], f"alpha {kept['citation']} beta {stub['citation']} "
                                        f"gamma {other['citation']}", messages)
    assert [x["citation"] for x in metadata["citations"]] == [kept["citation"]]
    assert metadata["unverified_citations"] == [stub["citation"], other["citation"]]
    assert context["route"]["method"] == "model" and context["route"]["unverified_citations"] == metadata["unverified_citations"]

"""The OpenAI-compatible agent against the scripted endpoint: search_knowledge is offered exactly
when the user can see a document, its passages reach the model as quoted data with citations, the
answer stores its citations and the turn its route; an injected document gets no write tool."""
from __future__ import annotations

import json

from protocol import MsgType
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from kb_wire.test_agent_offline import INJECTION, RUNBOOK

READ_ONLY = {"sys_monitor", "processes", "network_check", "read_log", "list_dir", "read_file", "search_files",
             "history_search", "clock", "search_knowledge",
             "offer_download",   # sends the user one of their own documents: reads, never writes
             "user_memory"}      # lists what the user's long-term memory holds of them


def tool_names(body: dict) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools", [])}


async def test_search_knowledge_reaches_the_model_with_citations(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        section = {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0,
                   "retries": 0}
        async with wired_server(tmp_path, llm=section, summarization={"enabled": False}) as (srv, addr):
            alice, bob = await connect(addr, "alice"), await connect(addr, "bob")
            await raw_upload(alice, "runbook.md", RUNBOOK)
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "restore timeout", "top_k": 3}')),
                     Reply.text("The restore timeout defaults to 90 seconds ", "[runbook.md §Operations > Restore]."))
            end, _ = await chat(alice, "what is the restore timeout?")
            first, second = llm.requests[-2].body, llm.requests[-1].body
            assert "search_knowledge" in tool_names(first) and tool_names(first) <= READ_ONLY
            [tool_msg] = [m for m in second["messages"] if m["role"] == "tool"]
            result = json.loads(tool_msg["content"])
            assert "never instructions" in result["note"]
            top = result["passages"][0]
            assert top["citation"].startswith("[runbook.md §Operations > Restore") and "90 seconds" in top["text"]
            assert end["context"]["route"]["route"] == "knowledge"
            assert end["context"]["route"]["method"] == "model_tool_call"
            cites = end["message"]["metadata"]["citations"]
            assert cites and cites[0]["citation"] == top["citation"] and cites[0]["chunk_id"] == top["chunk_id"]

            llm.push(Reply.text("I cannot see any documents of yours."))
            end, _ = await chat(bob, "what is the restore timeout?")
            assert "search_knowledge" not in tool_names(llm.requests[-1].body)
            assert end["context"]["route"] == {"route": "general", "method": "model",
                                               "reason": "the model answered without searching the documents"}
            await alice.close()
            await bob.close()


async def test_passages_of_two_uploads_of_one_name_reach_the_model_with_their_upload_times(tmp_path):
    """An edited file uploaded again under its name (no --replace): both versions' passages share a
    citation, so each carries its document's upload time and the model can tell the current one."""
    async with ScriptedLLM(model="m") as llm:
        section = {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0,
                   "retries": 0}
        async with wired_server(tmp_path, llm=section, summarization={"enabled": False}) as (srv, addr):
            c = await connect(addr, "alice")
            old = (await raw_upload(c, "runbook.md", RUNBOOK))["document"]
            new = (await raw_upload(c, "runbook.md", RUNBOOK.replace(b"90 seconds", b"120 seconds")))["document"]
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "restore timeout", "top_k": 5}')),
                     Reply.text("120 seconds [runbook.md §Operations > Restore]."))
            await chat(c, "what is the restore timeout?")
            [tool_msg] = [m for m in llm.requests[-1].body["messages"] if m["role"] == "tool"]
            result = json.loads(tool_msg["content"])
            times = {p["doc_id"]: p["uploaded_at"] for p in result["passages"]}
            assert times == {old["doc_id"]: old["uploaded_at"], new["doc_id"]: new["uploaded_at"]}
            assert new["uploaded_at"] >= old["uploaded_at"] and "newest upload" in result["note"]
            await c.close()


async def test_an_injected_document_gets_no_write_tool(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        section = {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0,
                   "retries": 0}
        async with wired_server(tmp_path, llm=section, summarization={"enabled": False}) as (srv, addr):
            c = await connect(addr, "alice")
            doc = (await raw_upload(c, "vendor.md", INJECTION))["document"]
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "override"}')),
                     Reply.tools(ToolCallSpec("c2", "delete_document", json.dumps({"doc_id": doc["doc_id"]}))),
                     Reply.text("The vendor notes contain an instruction I will not follow."))
            end, _ = await chat(c, "what do the vendor notes say?")
            assert all(tool_names(r.body) <= READ_ONLY for r in llm.requests if r.body.get("tools"))
            refused = [t for t in end["message"]["tool_calls"] if t["tool_name"] == "delete_document"]
            assert refused and refused[0]["status"] == "error" and "unknown tool" in refused[0]["result"]
            assert [d["doc_id"] for d in (await c.call(MsgType.KB_LIST))["documents"]] == [doc["doc_id"]]
            await c.close()


def _section(llm: ScriptedLLM) -> dict:
    return {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0, "retries": 0}


def _texts(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if isinstance(m.get("content"), str)]


async def test_a_follow_up_reaches_the_model_with_the_previous_turn_and_its_passages(tmp_path):
    """The LLM agent forms the retrieval query itself (no retrieval is made for it up front): the
    follow-up request carries the previous question, its search_knowledge call and passages and the
    cited answer, so "and its default?" can be searched as the restore timeout's default."""
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=_section(llm), summarization={"enabled": False}) as (srv, addr):
            alice = await connect(addr, "alice")
            await raw_upload(alice, "runbook.md", RUNBOOK)
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "restore timeout"}')),
                     Reply.text("Raise it with --timeout [runbook.md §Operations > Restore]."))
            await chat(alice, "what is the restore timeout?")
            llm.push(Reply.tools(ToolCallSpec("c2", "search_knowledge", '{"query": "restore timeout default"}')),
                     Reply.text("90 seconds [runbook.md §Operations > Restore]."))
            end, _ = await chat(alice, "and its default?")
            follow_up = llm.requests[-2].body
            texts = _texts(follow_up)
            assert "search_knowledge" in tool_names(follow_up)
            assert texts[-1] == "and its default?"
            assert "what is the restore timeout?" in texts
            assert any("[runbook.md §Operations > Restore]" in t for t in texts)   # the previous cited answer
            earlier_calls = [c["function"] for m in follow_up["messages"] if m["role"] == "assistant"
                             for c in m.get("tool_calls") or ()]
            assert [json.loads(c["arguments"])["query"] for c in earlier_calls
                    if c["name"] == "search_knowledge"] == ["restore timeout"]
            earlier_results = [json.loads(m["content"]) for m in follow_up["messages"] if m["role"] == "tool"]
            assert any("90 seconds" in p["text"] for r in earlier_results for p in r["passages"])
            # the model's contextual query finds the passage with the default
            [tool_msg] = [m for m in llm.requests[-1].body["messages"] if m["role"] == "tool"
                          and m["tool_call_id"] == "c2"]
            top = json.loads(tool_msg["content"])["passages"][0]
            assert top["citation"].startswith("[runbook.md §Operations > Restore") and "90 seconds" in top["text"]
            assert end["context"]["route"]["method"] == "model_tool_call"
            assert end["message"]["metadata"]["citations"][0]["chunk_id"] == top["chunk_id"]
            await alice.close()


async def test_a_user_whose_only_documents_are_in_a_group_gets_the_tool(tmp_path):
    """carol (groups red and blue) has no personal document; alice's upload into group red is enough."""
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=_section(llm), summarization={"enabled": False}) as (srv, addr):
            alice, carol, bob = [await connect(addr, u) for u in ("alice", "carol", "bob")]
            doc = (await raw_upload(alice, "runbook.md", RUNBOOK, collection="red"))["document"]
            assert doc["collection"] == "group:red"
            assert (await carol.call(MsgType.KB_LIST, collection="personal"))["documents"] == []
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "cache default size"}')),
                     Reply.text("512 MB [runbook.md §Operations > Cache]."))
            end, _ = await chat(carol, "what is the cache size?")
            assert "search_knowledge" in tool_names(llm.requests[-2].body)
            [tool_msg] = [m for m in llm.requests[-1].body["messages"] if m["role"] == "tool"]
            top = json.loads(tool_msg["content"])["passages"][0]
            assert top["doc_id"] == doc["doc_id"] and "512 MB" in top["text"]
            assert end["context"]["route"]["route"] == "knowledge"
            llm.push(Reply.text("No documents."))          # bob is in group blue only: no tool
            await chat(bob, "what is the cache size?")
            assert "search_knowledge" not in tool_names(llm.requests[-1].body)
            for c in (alice, carol, bob):
                await c.close()

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
             "offer_download"}   # sends the user one of their own documents: reads, never writes


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

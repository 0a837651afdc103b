"""Soak phase: provider faults through the scripted OpenAI-compatible server. One turn per fault; each
must end the way the issue says (an error with its code, or the answer after a retry), the server
must stay up and log no traceback."""
from __future__ import annotations


from protocol import MsgType
from soak_common import Measured, Row, SoakServer
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec
from testkit.server import V3Client

LLM_TOML = "[llm]\nretries = 1\nretry_backoff_s = 0.05\nrequest_timeout_s = 3.0\n"


def faults(huge: int) -> list[tuple[str, list[Reply], set[str]]]:
    """(name, script, acceptable outcomes): "end:<finish_reason>" or "error:<code>"."""
    return [
        ("500 then ok", [Reply.fail(500), Reply.text("recovered")], {"end:stop"}),
        ("500 twice", [Reply.fail(500), Reply.fail(500)], {"error:LLM_ERROR"}),
        ("429 retry-after", [Reply.fail(429, headers={"retry-after": "0.1"}), Reply.text("after 429")], {"end:stop"}),
        ("stall", [Reply.stalled("slow ")], {"error:LLM_TIMEOUT", "error:LLM_ERROR"}),
        ("cut stream", [Reply.cut_stream("half an ")], {"error:LLM_ERROR"}),
        ("cut stream abrupt", [Reply.cut_stream("half ", abrupt=True)], {"error:LLM_ERROR"}),
        ("HTML 200", [Reply.html()], {"error:LLM_ERROR"}),
        ("malformed SSE", [Reply.malformed("ok ")], {"error:LLM_ERROR"}),
        ("huge tool arguments", [Reply.tools(ToolCallSpec.huge("c1", "sys_monitor", huge)), Reply.text("done")],
         {"end:stop", "end:length", "end:context_budget", "error:LLM_ERROR", "error:TOOL_ERROR"}),
        ("two big tool calls", [Reply.tools(ToolCallSpec.huge("c1", "sys_monitor", huge // 3),
                                            ToolCallSpec.huge("c2", "sys_monitor", huge // 3)), Reply.text("done")],
         {"end:stop", "end:length", "end:context_budget", "error:LLM_ERROR", "error:TOOL_ERROR"}),
    ]


async def run(server: SoakServer, row: Row, *, huge: int, rounds: int, llm: ScriptedLLM) -> None:
    outcomes: list[str] = []
    c = await V3Client.connect(("127.0.0.1", server.port))
    try:
        for _ in range(rounds):
            for name, script, ok in faults(huge):
                llm.push(*script)
                try:
                    r = await c.call(MsgType.CHAT_TEXT, timeout=30, text=f"fault: {name}")
                    end = (await c.turn_events(r["turn_id"], timeout=60))[-1]
                    got = (f"end:{end.body.get('finish_reason')}" if end.type == MsgType.TURN_END
                           else f"error:{end.body.get('code')}")
                except Exception as exc:  # noqa: BLE001 - the finding
                    got = f"failed:{exc!r}"[:80]
                while llm.pending:   # what the turn did not consume must not feed the next fault
                    llm._queue.popleft()
                outcomes.append(f"{name}={got}")
                if got not in ok:
                    row.failures.append(f"{name}: {got}")
    finally:
        await c.close()
    row.tried = f"{len(outcomes)} faulty turns: " + ", ".join(dict.fromkeys(outcomes))


async def phase(server: SoakServer, row: Row, **kw) -> None:
    async with ScriptedLLM() as llm:
        server.env = {**server.env, "NPLT_LLM_BASE_URL": llm.base_url}
        await server.start()
        async with Measured(server, row, budget_s=120):
            await run(server, row, llm=llm, **kw)

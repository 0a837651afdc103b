"""history_to_openai: stored messages -> the exact OpenAI message sequence."""
from __future__ import annotations

from server.agent.transcript import UNFINISHED_RESULT, history_to_openai
from server.tools.schema import RAW_ARGUMENTS
from storage.models import ChatMessage, ToolCall


def _call(cid: str, name: str, args: dict, result: str, step: int, status: str = "success") -> ToolCall:
    return ToolCall(id=cid, tool_name=name, arguments=args, result=result, status=status, step=step)


def test_multi_step_turn_expands_exactly():
    history = [
        ChatMessage(id=1, role="user", content="How is the machine?"),
        ChatMessage(id=2, role="assistant", content="CPU 3%, memory 40%.", tool_calls=[
            _call("c1", "sys_monitor", {"metric": "cpu"}, '{"cpu":{"percent":3.0}}', 0),
            _call("c2", "sys_monitor", {"metric": "memory"}, '{"memory":{"percent":40.0}}', 0),
            _call("c3", "processes", {"sort_by": "cpu", "limit": 3}, '{"processes":[]}', 1),
        ]),
        ChatMessage(id=3, role="user", content="谢谢"),
        ChatMessage(id=4, role="assistant", content="不客气"),
    ]
    assert history_to_openai(history) == [
        {"role": "user", "content": "How is the machine?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sys_monitor", "arguments": '{"metric":"cpu"}'}},
            {"id": "c2", "type": "function", "function": {"name": "sys_monitor", "arguments": '{"metric":"memory"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"cpu":{"percent":3.0}}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"memory":{"percent":40.0}}'},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function",
             "function": {"name": "processes", "arguments": '{"sort_by":"cpu","limit":3}'}}]},
        {"role": "tool", "tool_call_id": "c3", "content": '{"processes":[]}'},
        {"role": "assistant", "content": "CPU 3%, memory 40%."},
        {"role": "user", "content": "谢谢"},
        {"role": "assistant", "content": "不客气"},
    ]


def test_steps_are_grouped_even_when_stored_out_of_order():
    msg = ChatMessage(id=2, role="assistant", content="ok", tool_calls=[
        _call("b", "clock", {}, "{}", 1), _call("a", "clock", {}, "{}", 0)])
    out = history_to_openai([msg])
    assert [m["role"] for m in out] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert out[0]["tool_calls"][0]["id"] == "a" and out[2]["tool_calls"][0]["id"] == "b"


def test_malformed_arguments_and_unfinished_calls_stay_valid():
    msg = ChatMessage(id=2, role="assistant", content="", metadata={"partial": True}, tool_calls=[
        _call("x", "sys_monitor", {RAW_ARGUMENTS: '{"metric": cpu'}, '{"error":"bad json"}', 0, "error"),
        _call("y", "clock", {}, "", 0, "running"),
    ])
    out = history_to_openai([ChatMessage(id=1, role="user", content="q"), msg])
    assert out[1]["tool_calls"][0]["function"]["arguments"] == '{"invalid_arguments":"{\\"metric\\": cpu"}'
    assert out[2] == {"role": "tool", "tool_call_id": "x", "content": '{"error":"bad json"}'}
    assert out[3] == {"role": "tool", "tool_call_id": "y", "content": UNFINISHED_RESULT}
    assert len(out) == 4   # empty final content is not sent


def test_system_kept_and_standalone_tool_messages_dropped():
    out = history_to_openai([ChatMessage(id=1, role="system", content="be brief"),
                             ChatMessage(id=2, role="tool", content="orphan"),
                             ChatMessage(id=3, role="user", content="hi")])
    assert out == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]

"""fit_assistant_message: the stored assistant message fits max_message_bytes, cut with marks."""
from __future__ import annotations

import orjson

from server.agent.fit_message import MARK, encoded_size, fit_assistant_message
from storage.models import ToolCall

LIMIT = 1 << 20


def call(i: int, args: dict, result: str = "{}") -> ToolCall:
    return ToolCall(id=f"call_{i}", tool_name="sys_monitor", arguments=args, result=result, step=0)


def test_a_message_that_fits_is_returned_as_is():
    calls = [call(0, {"metric": "cpu"}, '{"cpu": 3}')]
    fitted = fit_assistant_message("fine", calls, {"model": "m"}, LIMIT)
    assert (fitted.content, fitted.tool_calls, fitted.metadata, fitted.cut) == ("fine", calls, {"model": "m"}, False)


def test_two_megabytes_of_arguments_are_cut_to_fit_with_a_mark():
    args = {"metric": "memory", "note": "x" * (2 << 20)}
    original = call(0, args, '{"error": "unknown argument note"}')
    fitted = fit_assistant_message("The call failed.", [original], {"model": "m"}, LIMIT)
    assert fitted.cut and fitted.metadata == {"model": "m", "truncated": True}
    assert encoded_size(fitted.content, fitted.tool_calls, fitted.metadata) <= LIMIT - 64
    assert encoded_size(fitted.content, fitted.tool_calls, fitted.metadata) > LIMIT * 0.9   # not cut more than needed
    [c] = fitted.tool_calls
    assert c.arguments["truncated"] is True
    partial = c.arguments["partial"]
    assert partial.startswith('{"metric":"memory","note":"xxx')
    assert partial.endswith(MARK.format(n=len(orjson.dumps(args)) - partial.index("\n[...")))
    assert fitted.content == "The call failed." and c.result == original.result     # short texts are kept
    assert original.arguments is args and len(args["note"]) == 2 << 20                  # the input is untouched


def test_two_calls_of_600_kb_share_the_cut():
    calls = [call(i, {"note": "y" * 600_000}) for i in range(2)]
    fitted = fit_assistant_message("", calls, {}, LIMIT)
    sizes = [len(c.arguments["partial"]) for c in fitted.tool_calls]
    assert abs(sizes[0] - sizes[1]) <= 2 and encoded_size("", fitted.tool_calls, fitted.metadata) <= LIMIT


def test_results_and_content_are_cut_too_and_cjk_counts_in_bytes():
    calls = [call(0, {"metric": "all"}, "结果" * 300_000)]
    fitted = fit_assistant_message("回答" * 200_000, calls, {}, LIMIT)
    assert encoded_size(fitted.content, fitted.tool_calls, fitted.metadata) <= LIMIT
    assert fitted.tool_calls[0].arguments == {"metric": "all"}
    assert "cut to fit max_message_bytes" in fitted.content
    assert "cut to fit max_message_bytes" in fitted.tool_calls[0].result


def test_calls_are_dropped_from_the_end_only_when_nothing_else_fits():
    calls = [call(i, {}) for i in range(200)]
    fitted = fit_assistant_message("answer", calls, {}, 4096)
    assert encoded_size(fitted.content, fitted.tool_calls, fitted.metadata) <= 4096
    kept = len(fitted.tool_calls)
    assert 0 < kept < 200 and fitted.metadata["tool_calls_dropped"] == 200 - kept
    assert [c.id for c in fitted.tool_calls] == [f"call_{i}" for i in range(kept)]


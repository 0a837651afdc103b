"""MessageView rendering: live streaming stays bounded (finished paragraphs are frozen), settling, helpers."""
from __future__ import annotations

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown, Static

from client.tui.chat import code_blocks
from client.tui.message import MAX_SEGMENTS, SEGMENT_CHARS, MessageView, split_point
from client.tui.toolcall import ToolCallItem, format_result
from client_testlib import wait_until
from protocol.objects import ChatMessage, ToolCall


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="host")


def test_split_point_skips_code_fences() -> None:
    assert split_point("no break here") == 0
    assert split_point("one\n\ntwo") == len("one\n\n")
    text = "intro\n\n```\ncode\n\nmore code\n"   # the last break is inside an open fence
    assert split_point(text) == len("intro\n\n")
    assert split_point("```\na\n\nb\n```\n\nafter") == len("```\na\n\nb\n```\n\n")


def test_code_blocks() -> None:
    assert code_blocks("text\n```python\nx = 1\n```\nand\n```\ny\n```") == ["x = 1\n", "y\n"]
    assert code_blocks("none") == []


async def test_long_stream_keeps_the_live_markdown_small() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 40 + "\n\n" for i in range(60)]
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        view = MessageView(ChatMessage(None, "assistant", ""), turn_id="t1")
        await app.query_one("#host").mount(view)
        largest_live = 0
        for p in paragraphs:
            for i in range(0, len(p), 7):
                await view.append(p[i:i + 7])
            largest_live = max(largest_live, len(view._live_text))
        await view.stop_stream()
        text = "".join(paragraphs)
        assert view.content == text and view.streamed_chars == len(text)
        segments = view.query(".segment")
        assert 1 <= len(segments) <= MAX_SEGMENTS   # finished paragraphs frozen, segments merged
        assert "".join(seg.text for seg in segments) + view._live_text == text
        assert largest_live <= SEGMENT_CHARS + max(len(p) for p in paragraphs)
        live_blocks = len(view.query_one(Markdown).children)
        assert live_blocks <= SEGMENT_CHARS // 200 + 2   # bounded, whatever the answer length
        await view.finish(ChatMessage(7, "assistant", text))
        await wait_until(lambda: not view.query(Markdown), pilot=pilot, what="settled body")
        assert not view.is_live and view.message_id == 7
        assert len(view.query(Static)) == 1 and not view.query(".segment")


async def test_finish_repairs_missed_deltas_and_shows_tool_calls() -> None:
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        view = MessageView(ChatMessage(None, "assistant", "partial"), turn_id="t1")
        await app.query_one("#host").mount(view)
        call = ToolCall("c1", "sys_monitor", {"metric": "cpu"}, "12%", "success", 0.5)
        await view.finish(ChatMessage(3, "assistant", "the full answer", tool_calls=(call,),
                                      metadata={"partial": True}), "cancelled")
        await pilot.pause()
        assert view.content == "the full answer"
        assert list(view.tool_items) == ["c1"] and view.tool_items["c1"].status == "success"
        assert "partial" in view.header_text and "cancelled" in view.header_text


def test_tool_results_are_pretty_printed_like_the_arguments() -> None:
    assert format_result('{"b": 1, "a": [1, 2]}') == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'
    assert format_result("[1,2]") == "[\n  1,\n  2\n]"
    assert format_result("cpu 5%") == "cpu 5%"
    assert format_result("{not json") == "{not json"


async def test_a_tool_item_shows_a_json_result_indented() -> None:
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        call = ToolCall("c1", "sys_monitor", {"metric": "cpu"}, '{"cpu": {"percent": 5}}', "success", 0.1)
        item = ToolCallItem(call)
        await app.query_one("#host").mount(item)
        await pilot.pause()
        assert str(item.query_one(".tool-result").render()) == '{\n  "cpu": {\n    "percent": 5\n  }\n}'


async def test_a_turn_closed_after_a_crash_shows_partial_and_interrupted() -> None:
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:   # the message the server stores at start (issue 15)
        meta = {"partial": True, "interrupted": True, "finish_reason": "interrupted", "answers": 3}
        view = MessageView(ChatMessage(4, "assistant", "", metadata=meta))
        await app.query_one("#host").mount(view)
        await pilot.pause()
        assert view.header_text.count("partial") == 1 and view.header_text.count("interrupted") == 1


def body_lines(view: MessageView) -> list[str]:
    """The body's text as drawn on screen, one string per row (trailing blanks dropped)."""
    body = view.body
    return [strip.text.rstrip() for strip in body.render_lines(body.size.region)]


async def test_the_users_own_message_shows_as_typed_and_an_answer_as_markdown() -> None:
    typed = ("check these lines\nERROR disk full on /dev/sda1\nWARN __init__.py failed *twice*\n磁盘已满，端口 8080\n"
             "[b]no markup[/b] either")
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        mine = MessageView(ChatMessage(1, "user", typed))
        queued = MessageView(ChatMessage(None, "user", "a *queued* __one__", metadata={"queued": True}))
        answer = MessageView(ChatMessage(2, "assistant", typed))
        await app.query_one("#host").mount_all([mine, queued, answer])
        await queued.finish(ChatMessage(3, "user", "a *queued* __one__"))   # settled once its turn starts
        await pilot.pause()
        assert body_lines(mine)[:5] == typed.split("\n")          # line breaks, markers and wide characters kept
        assert body_lines(queued)[0] == "a *queued* __one__"
        drawn = body_lines(answer)                                 # the answer is still Markdown
        assert any("WARN init.py failed twice" in line for line in drawn)
        assert not any("ERROR disk full" in line and line.startswith("ERROR") for line in drawn)

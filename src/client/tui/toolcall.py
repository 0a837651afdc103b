"""A tool call shown as a collapsible item: name, status and duration in the title; arguments and result inside."""
from __future__ import annotations

import json
from typing import Any

from textual.markup import escape
from textual.widgets import Collapsible, Static

from protocol.objects import ToolCall

from client.wording import printable

MAX_RESULT_CHARS = 4000   # longer results are cut in the view (the full text stays in history/export)
STATUS_ICONS = {"running": "…", "success": "✓", "error": "✗", "timeout": "⏱"}


def tool_title(call: ToolCall) -> str:
    """The one-line title: icon, tool name, status, duration (markup-escaped, made printable)."""
    status = call.status or "running"
    icon = STATUS_ICONS.get(status, "?")
    name = escape(printable(call.tool_name or "tool"))
    if status == "running":
        return f"{icon} {name} · running"
    return f"{icon} {name} · {escape(printable(status))} · {float(call.duration or 0.0):.3f}s"


def format_arguments(arguments: Any) -> str:
    """The arguments as shown: indented JSON, made printable (JSON escapes C0 controls, not C1 ones)."""
    try:
        return printable(json.dumps(arguments, ensure_ascii=False, indent=2, sort_keys=True))
    except (TypeError, ValueError):
        return printable(str(arguments))


def format_result(result: str) -> str:
    """A result as shown: a JSON object or array is pretty-printed like the arguments; other text as
    is; either made printable (a tool's output quotes files, logs, documents)."""
    text = result.strip()
    if text[:1] in ("{", "["):
        try:
            return format_arguments(json.loads(text))
        except ValueError:  # text that only looks like JSON: shown as it came
            return printable(result)
    return printable(result)


class ToolCallItem(Collapsible):
    """One ToolCall (docs/protocol.md §3), live (updated on TOOL_RESULT) or read from history."""

    DEFAULT_CLASSES = "tool-call"

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self._args = Static(format_arguments(call.arguments), markup=False, classes="tool-args")
        self._result = Static(self._result_text(), markup=False, classes="tool-result")
        super().__init__(self._args, self._result, title=tool_title(call), collapsed=True)
        self._apply_status_class()

    @property
    def call_id(self) -> str:
        return self.call.id

    @property
    def status(self) -> str:
        return self.call.status or "running"

    def _result_text(self) -> str:
        if self.status == "running":
            return "(running)"
        result = format_result(self.call.result)
        if len(result) > MAX_RESULT_CHARS:
            result = result[:MAX_RESULT_CHARS] + f"\n… ({len(result) - MAX_RESULT_CHARS} more characters)"
        return result or "(no output)"

    def _apply_status_class(self) -> None:
        for s in STATUS_ICONS:
            self.set_class(s == self.status, f"-{s}")

    def update_call(self, call: ToolCall) -> None:
        """Show the finished call (or a newer state of it)."""
        self.call = call
        self.title = tool_title(self.call)
        self._args.update(format_arguments(self.call.arguments))
        self._result.update(self._result_text())
        self._apply_status_class()

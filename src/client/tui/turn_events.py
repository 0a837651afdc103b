"""Rendering of one session's turn events in the chat view (the Controller mixes this in).

TURN_START opens a live assistant message, tool events add tool items to it, runs of ANSWER_DELTA are
appended at once (offsets below the shown length are dropped), TURN_END / TURN_ERROR finalize it.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from client.events import Event
from client.tui.batch import join_deltas
from client.tui.message import MessageView

if TYPE_CHECKING:
    from client.tui.chat import ChatView
    from client.tui.status import StatusLine


def _now() -> str:
    """Current time, ISO 8601 UTC (timestamps of live messages before the server's arrive)."""
    return datetime.now(timezone.utc).isoformat()


class TurnEvents:
    chat: ChatView
    status: StatusLine

    async def on_turn_event(self, event: Event) -> None:
        chat, body, turn_id = self.chat, event.body, event.turn_id or ""
        t = event.type
        if t == "TURN_START":
            if body.get("user_message") and not await chat.settle_pending(turn_id, body["user_message"]):
                await chat.add_message(body["user_message"])
            await self._live(turn_id)
            self.status.set_turn("thinking")
        elif t == "TURN_STATUS":
            self.status.set_turn(body.get("status") or "thinking", body.get("detail"))
        elif t in ("TOOL_CALL", "TOOL_RESULT"):
            await (await self._live(turn_id)).add_tool(body.get("call") or {})
        elif t == "ANSWER_DELTA":
            await self.on_deltas(turn_id, [body])
        elif t == "TURN_END" and body.get("withdrawn"):   # a queued turn cancelled before it started
            await chat.settle_pending(turn_id, None)
        elif t == "TURN_END":
            message = body.get("message")
            view = self.chat.live.get(turn_id)
            if body.get("truncated") and isinstance(message, dict) and view is not None \
                    and len(view.content) > len(str(message.get("content") or "")):
                # the server cut the stored answer to fit max_message_size: keep the streamed text
                message = {**message, "content": view.content}
            await self._end(turn_id, message, body.get("finish_reason"))
        elif t == "TURN_ERROR":
            view = await self._end(turn_id, body.get("partial_message"), None)
            text = f"Error {body.get('code')}: {body.get('message')}"
            if view is not None:
                view.set_error(text)
            else:
                await chat.add_error(text)

    async def on_deltas(self, turn_id: str, bodies: list[dict[str, Any]]) -> None:
        """Append consecutive deltas of a turn at once; deltas below the shown length are dropped."""
        view = await self._live(turn_id)
        text = join_deltas(view.shown_len, bodies)
        if text:
            await view.append(text)

    async def _live(self, turn_id: str) -> MessageView:
        view = self.chat.live.get(turn_id)
        if view is None:
            view = await self.chat.add_message({"role": "assistant", "content": "", "timestamp": _now()},
                                               turn_id=turn_id)
        return view

    async def _end(self, turn_id: str, message: dict[str, Any] | None, finish_reason: str | None) -> MessageView | None:
        chat = self.chat
        view = chat.live.pop(turn_id, None)
        if not chat.live:
            self.status.set_turn(None)
        if message is None:
            if view is not None:
                await view.stop_stream()
            return view
        existing = chat.by_id.get(message.get("id")) if isinstance(message.get("id"), int) else None
        if existing is not None and existing is not view:
            if view is not None:
                await view.stop_stream()
                await view.remove()
            return existing
        if view is None:
            view = await chat.add_message(message)
        await view.finish(message, finish_reason)
        chat.register_id(view)
        return view

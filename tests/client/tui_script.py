"""What the TUI tests against the fake client share: the app opened on a scripted FakeClient, and
stored messages made short."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from textual.app import App

from client.config import ClientConfig
from client.tui.app import NpltApp
from client_testlib import SIZE, chat, wait_until
from fake_client import FakeClient, stamp
from protocol.objects import ChatMessage


@asynccontextmanager
async def scripted_app(fake: FakeClient, size: tuple[int, int] = SIZE) -> AsyncIterator[tuple[NpltApp, Any]]:
    """The TUI on ``fake``, once it shows the first session and has the lists (models)."""
    app = NpltApp(ClientConfig(), client=fake)  # type: ignore[arg-type]
    async with app.run_test(size=size) as pilot:
        await wait_until(lambda: fake.connected and chat(app).session_id is not None and app.controller._loads == 0
                         and bool(app.controller.models), pilot=pilot, what="the first session and the lists")
        yield app, pilot


def contents(app: NpltApp) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in chat(app).messages()]


def notes(app: App[Any]) -> list[str]:
    return [str(n.message) for n in app._notifications]


def user(mid: int, text: str) -> ChatMessage:
    return ChatMessage(mid, "user", text, stamp(mid))


def answer(mid: int, text: str, **meta: Any) -> ChatMessage:
    return ChatMessage(mid, "assistant", text, stamp(mid), metadata=meta)


def interrupted(mid: int, text: str = "") -> ChatMessage:
    """What a server killed mid-answer (or the cluster node closing its turn) stores for it."""
    return answer(mid, text, partial=True, interrupted=True, finish_reason="interrupted")

"""Pilot tests of queued turns in the TUI against a real in-process server: messages sent while an
answer streams wait at the bottom marked "queued", settle in question/answer order, can be withdrawn,
and are shown on reattach."""
from __future__ import annotations

from client.connection import Client
from client.tui.app import NpltApp
from client_testlib import chat, open_app, type_and_send, wait_until
from testkit.echo_agent import EchoAgent


def contents(app: NpltApp) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in chat(app).messages()]


async def test_queued_messages_wait_at_the_bottom_then_settle_in_order(server, echo: EchoAgent) -> None:
    _, addr = server
    async with open_app(addr) as (app, pilot):
        view = chat(app)
        await type_and_send(pilot, "!block one")
        await echo.wait_blocked(1)
        await type_and_send(pilot, "two")
        await type_and_send(pilot, "three")
        await wait_until(lambda: len(view.pending) == 2, pilot=pilot, what="two queued messages")
        assert [r for r, _ in contents(app)][-2:] == ["user", "user"]
        assert [c for _, c in contents(app)][-2:] == ["two", "three"]
        assert all("queued" in m.header_text and m.message_id is None for m in view.pending.values())
        withdrawn = list(view.pending)[1]                       # "three", withdrawn from another client
        async with Client(*addr) as other:
            await other.chat_cancel(turn_id=withdrawn)
        await wait_until(lambda: withdrawn not in view.pending, pilot=pilot, what="withdrawn message removed")
        echo.release()
        expected = [("user", "!block one"), ("assistant", "echo: !block one"),
                    ("user", "two"), ("assistant", "echo: two")]
        # (the answer leaves ``live`` before it has settled into its stored message: wait for the ids too)
        await wait_until(lambda: contents(app) == expected and not view.live
                         and all(m.message_id is not None for m in view.messages()), pilot=pilot,
                         what="question/answer order, every message stored")
        assert not view.pending
        assert not any("queued" in m.header_text for m in view.messages())


async def test_reattach_shows_the_queued_messages(server, echo: EchoAgent) -> None:
    _, addr = server
    async with Client(*addr) as other:
        await other.session_new(title="busy")
        await other.chat_send("!block first")
        await echo.wait_blocked(1)
        await other.chat_send("second")
        async with open_app(addr) as (app, pilot):
            view = chat(app)
            await wait_until(lambda: bool(view.live) and len(view.pending) == 1, pilot=pilot,
                             what="reattached turn and its queue")
            assert contents(app)[-1] == ("user", "second")
            echo.release()
            await wait_until(lambda: contents(app) == [("user", "!block first"), ("assistant", "echo: !block first"),
                                                       ("user", "second"), ("assistant", "echo: second")]
                             and not view.live and not view.pending, pilot=pilot, what="settled order")

"""Defects found by the second review of the TUI: a message whose reply was lost is not given back
(it could be sent twice) and the reload says whether the server has it; two quick Enters send once;
streamed text survives a cluster node's interrupted TURN_END and a reload that fails; the focus
leaves a sidebar that hides; one download per file at a time; a message sent during a reload shows
below the reloaded history.

Most run under Pilot against the fake client (tests/client/fake_client.py); the lost reply runs
against a real server behind a loopback proxy that holds the server's bytes, then cuts the link."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App

from client.config import ClientConfig
from client.connection import Client
from client.errors import ClientCode, ClientError
from client.events import Connected, Reconnecting
from client.tui.app import NpltApp
from client.tui.input import ChatInput
from client.tui.sidebar import Sidebar
from client.tui.state import NOT_SAVED
from client_testlib import SIZE, chat, push_download_panel, type_and_send, v3_server, wait_until
from tui_script import answer, interrupted, notes, scripted_app, user
from fake_client import FakeClient, stamp
from protocol.kb import KbDocument
from protocol.objects import ChatMessage, SessionInfo
from protocol.server_events import AnswerDelta, TurnEnd, TurnStart

STREAMED = "慢速回答第0段。Slow answer part 0, which the user is reading. " * 4


def contents(app: NpltApp) -> list[tuple[str, str]]:
    return [(v.role, v.content) for v in chat(app).messages()]


# -- 1. a message whose reply was lost -------------------------------------------------------------
class Proxy:
    """A loopback proxy to the server: while ``hold`` is set the server's bytes do not reach the
    client (a reply lost on the way); ``cut`` drops the connections (the client then reconnects)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.hold = False
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[:2]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        self.writers += [client_w, server_w]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, held: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if not (held and self.hold):
                        writer.write(data)
                        await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.transport.abort()
        await asyncio.gather(pipe(client_r, server_w, False), pipe(server_r, client_w, True))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_a_message_whose_reply_was_lost_is_not_given_back_and_the_reload_says_it_was_sent(
        tmp_path: Path) -> None:
    text = "transfer 100 EUR to Bob"
    async with v3_server(tmp_path) as (_srv, addr), Client(*addr) as direct:
        sid = (await direct.session_new()).session.session_id
        proxy = Proxy(addr)
        host, port = await proxy.start()
        app = NpltApp(ClientConfig(host=host, port=port, reconnect_initial_s=0.05, reconnect_max_s=0.2),
                      state_path=tmp_path / "state.json")
        try:
            async with app.run_test(size=SIZE) as pilot:
                await wait_until(lambda: app.client.connected and app.controller._loads == 0
                                 and chat(app).session_id == sid and bool(app.controller.models),
                                 pilot=pilot, what="the session and the lists")
                proxy.hold = True                 # the reply to the message will not come
                await type_and_send(pilot, text)

                async def stored() -> bool:
                    page = await direct.history_page(sid)
                    return any(m.role == "user" and m.content == text for m in page.messages)
                deadline = asyncio.get_running_loop().time() + 10
                while not await stored():
                    assert asyncio.get_running_loop().time() < deadline, "the server never stored the message"
                    await pilot.pause(0.01)
                proxy.cut()                       # the link drops before the reply: CONNECTION_LOST
                proxy.hold = False
                await wait_until(lambda: any(n.endswith("reached the server: it is in the chat, do not send it "
                                                        "again.") for n in notes(app)),
                                 pilot=pilot, what="the reload saying the message was sent")
                box = app.query_one(ChatInput)
                assert box.text == ""             # not given back as if it was not sent
                assert box.recall[-1] == text     # Up recalls it
                assert any("CONNECTION_LOST" in n and "may have reached the server" in n for n in notes(app))
                assert contents(app).count(("user", text)) == 1
                await pilot.press("enter")        # nothing to send twice
                await pilot.pause()
                page = await direct.history_page(sid)
                assert [m.content for m in page.messages if m.role == "user"] == [text]
        finally:
            await proxy.close()


async def test_a_message_whose_reply_timed_out_is_not_given_back_and_a_reload_says_it_did_not_arrive() -> None:
    fake = FakeClient(messages={"s1": [user(1, "old"), answer(2, "old answer")]})
    async with scripted_app(fake) as (app, pilot):
        async def no_reply(text: str, session_id: str | None = None) -> Any:
            fake.calls.append(("chat_send", text))
            raise ClientError(ClientCode.TIMEOUT, "no reply to CHAT_TEXT within the timeout")
        fake.chat_send = no_reply  # type: ignore[method-assign]
        await type_and_send(pilot, "did it arrive?")
        await wait_until(lambda: any("may have reached the server" in n for n in notes(app)), pilot=pilot,
                         what="the unknown fate said")
        box = app.query_one(ChatInput)
        assert box.text == "" and box.recall[-1] == "did it arrive?"
        await fake.push(Reconnecting(1, 0.1, "connection lost"), Connected(fake.hello, reconnected=True))
        await wait_until(lambda: any("did not reach the server" in n for n in notes(app)), pilot=pilot,
                         what="the reload saying it did not arrive")
        assert box.text == "" and not any("it is in the chat" in n for n in notes(app))


# -- 2. two quick Enters send the message once --------------------------------------------------------
async def test_two_quick_enters_send_the_message_once() -> None:
    fake = FakeClient(messages={"s1": []})
    async with scripted_app(fake) as (app, pilot):
        box = app.query_one(ChatInput)
        box.focus()
        box.load_text("hello once")
        await pilot.pause()
        # two Enters read from the terminal at once: both queued before the app takes the first message
        app.post_message(events.Key("enter", "\r"))
        app.post_message(events.Key("enter", "\r"))
        await wait_until(lambda: ("user", "hello once") in contents(app), pilot=pilot, what="the sent message")
        await pilot.pause()
        assert [c for c in fake.calls if c[0] == "chat_send"] == [("chat_send", "hello once")]
        assert box.text == ""
        # a message that cannot be sent stays, and Enter submits it again once it can be
        fake.state = "reconnecting"
        box.load_text("later")
        await pilot.press("enter")
        await wait_until(lambda: any("reconnecting" in n for n in notes(app)), pilot=pilot, what="not sent")
        fake.state = "connected"
        await pilot.press("enter")
        await wait_until(lambda: ("chat_send", "later") in fake.calls, pilot=pilot, what="sent when connected")


# -- 3. a cluster node's interrupted TURN_END keeps what was streamed -------------------------------------
async def test_an_interrupted_turn_end_keeps_the_streamed_text_marked_not_saved() -> None:
    fake = FakeClient(messages={"s1": []})
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(1, "slow question"), "fake"), AnswerDelta("s1", "t1", STREAMED, 0))
        await wait_until(lambda: ("assistant", STREAMED) in contents(app), pilot=pilot, what="the streamed text")
        # the node streaming it died; another node closes the turn with what was saved: nothing
        await fake.push(TurnEnd("s1", "t1", interrupted(2), {}, "interrupted", {}))
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the settled answer")
        view = chat(app).by_id[2]
        assert view.content == STREAMED and view.message.metadata[NOT_SAVED] == 0
        assert "interrupted" in view.header_text and "not saved" in view.header_text
        assert any("not saved on the server" in str(n.render()) for n in view.query(".message-note"))


# -- 4. the streamed text outlives a reload that failed ------------------------------------------------
async def test_the_streamed_text_outlives_a_reload_that_failed() -> None:
    fake = FakeClient(messages={"s1": []})
    async with scripted_app(fake) as (app, pilot):
        await fake.push(TurnStart("s1", "t1", user(1, "slow question"), "fake"), AnswerDelta("s1", "t1", STREAMED, 0))
        await wait_until(lambda: ("assistant", STREAMED) in contents(app), pilot=pilot, what="the streamed text")
        fake.messages["s1"] = [user(1, "slow question"), interrupted(2)]   # the server was killed
        real_page = fake.history_page
        failed = asyncio.Event()

        async def lost_once(*args: Any, **kwargs: Any) -> Any:
            if not failed.is_set():
                failed.set()
                raise ClientError(ClientCode.CONNECTION_LOST, "connection lost: the server died again")
            return await real_page(*args, **kwargs)
        fake.history_page = lost_once  # type: ignore[method-assign]
        await fake.push(Reconnecting(1, 0.1, "connection lost"), Connected(fake.hello, reconnected=True))
        await wait_until(lambda: failed.is_set() and app.controller._loads == 0, pilot=pilot,
                         what="the failed reload")
        await fake.push(Reconnecting(1, 0.1, "connection lost"), Connected(fake.hello, reconnected=True))
        await wait_until(lambda: 2 in chat(app).by_id, pilot=pilot, what="the second reload")
        view = chat(app).by_id[2]
        assert view.content == STREAMED and "not saved" in view.header_text


# -- 5. the focus leaves a sidebar that hides ---------------------------------------------------------
async def test_the_focus_goes_to_the_input_when_the_focused_sidebar_hides() -> None:
    fake = FakeClient(sessions=[SessionInfo("s1", "First", stamp(0), stamp(0)),
                                SessionInfo("s2", "Second", stamp(1), stamp(1))])
    async with scripted_app(fake, (100, 30)) as (app, pilot):
        sidebar, box = app.query_one(Sidebar), app.query_one(ChatInput)
        await pilot.press("ctrl+g")
        await wait_until(lambda: app.focused is sidebar.list, pilot=pilot, what="the sessions list focused")
        await pilot.resize_terminal(60, 30)           # too narrow: the sidebar hides
        await wait_until(lambda: not sidebar.display and app.focused is box, pilot=pilot, what="the input focused")
        await pilot.press("a", "b", "c")
        assert box.text == "abc"                       # typing is not lost
        await pilot.resize_terminal(100, 30)
        await pilot.press("ctrl+g")
        await wait_until(lambda: sidebar.display and app.focused is sidebar.list, pilot=pilot, what="the list again")
        await pilot.press("ctrl+b")                    # hidden by the user while focused
        await wait_until(lambda: not sidebar.display and app.focused is box, pilot=pilot, what="the input again")


# -- 6. one download per file at a time -----------------------------------------------------------------
async def test_a_second_download_of_the_same_file_waits_for_none_and_is_refused(tmp_path: Path) -> None:
    release = asyncio.Event()
    downloads: list[Path] = []
    document = KbDocument("d1", "runbook.md", "m", "s", 5, 1, "user:me", stamp(1), "me")

    async def listing() -> list[KbDocument]:
        return [document]

    async def download(doc: KbDocument, dest: Path) -> KbDocument:
        downloads.append(dest)
        await release.wait()
        dest.write_text("the document", encoding="utf-8")
        return doc

    app: App[None] = App()
    async with app.run_test(size=SIZE) as pilot:
        panel = await push_download_panel(app, pilot, tmp_path, listing, download)
        app.post_message(events.Key("d", "d"))        # two quick presses, before the file exists
        app.post_message(events.Key("d", "d"))
        await wait_until(lambda: any("Already downloading" in n for n in notes(app)), pilot=pilot,
                         what="the second press refused")
        await wait_until(lambda: downloads == [tmp_path / "runbook.md"], pilot=pilot, what="one download")
        release.set()
        await wait_until(lambda: any("Downloaded to" in n for n in notes(app)), pilot=pilot, what="its end")
        assert downloads == [tmp_path / "runbook.md"] and not any("failed" in n for n in notes(app))
        assert not panel.downloading


# -- 7. a message sent during a reload shows below the history -----------------------------------------
async def test_a_message_sent_while_the_session_reloads_shows_below_the_history() -> None:
    fake = FakeClient(messages={"s1": [user(1, "old"), answer(2, "old answer")]})
    async with scripted_app(fake) as (app, pilot):
        page_asked, page_free = asyncio.Event(), asyncio.Event()
        real_page = fake.history_page

        async def slow_page(*args: Any, **kwargs: Any) -> Any:
            page_asked.set()
            await page_free.wait()
            return await real_page(*args, **kwargs)
        fake.history_page = slow_page  # type: ignore[method-assign]
        await fake.push(Reconnecting(1, 0.1, "lost"), Connected(fake.hello, reconnected=True))
        await wait_until(page_asked.is_set, pilot=pilot, what="the reload waiting for its page")
        await type_and_send(pilot, "new message")
        await wait_until(lambda: ("chat_send", "new message") in fake.calls, pilot=pilot, what="the send")
        await pilot.pause()
        fake.messages["s1"].append(ChatMessage(1001, "user", "new message", stamp(3)))   # stored by the server
        page_free.set()
        await wait_until(lambda: app.controller._loads == 0 and 1001 in chat(app).by_id, pilot=pilot,
                         what="the reloaded page and the message")
        await pilot.pause()
        assert contents(app) == [("user", "old"), ("assistant", "old answer"), ("user", "new message")]

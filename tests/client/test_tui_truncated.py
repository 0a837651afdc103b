"""An answer over the server's max_message_size: the TUI keeps what it streamed (Pilot, real server)."""
from __future__ import annotations

from pathlib import Path

from client_testlib import chat, open_app, type_and_send, v3_server, wait_until
from testkit.echo_agent import EchoAgent


async def test_a_cut_turn_end_keeps_the_streamed_answer_and_history_shows_the_mark(tmp_path: Path) -> None:
    async with v3_server(tmp_path, agent=EchoAgent(), max_message_size=65535) as (_, addr):
        async with open_app(addr) as (app, pilot):
            await type_and_send(pilot, "!big 90000")

            def finished() -> bool:
                return any(m.role == "assistant" and m.message_id and m.turn_id is None
                           for m in chat(app).messages())
            await wait_until(finished, pilot=pilot, what="the end of the big turn")
            answer = [m for m in chat(app).messages() if m.role == "assistant"][-1]
            assert answer.content == "x" * 90_000            # all of it, not the cut TURN_END copy
        async with open_app(addr) as (app, pilot):         # a fresh client reads it from history
            answer = [m for m in chat(app).messages() if m.role == "assistant"][-1]
            assert answer.content.startswith("x" * 1000) and "cut by the server" in answer.content

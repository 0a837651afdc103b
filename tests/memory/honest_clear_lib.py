"""What the honest-clear end-to-end tests share (test_honest_clear_e2e.py with the echo agent,
test_honest_clear_llm_e2e.py with a scripted OpenAI endpoint): planted secrets, a session that holds
them in its summary and in long-term memory, and the check that they are gone."""
from __future__ import annotations

from typing import Any

from protocol import MsgType
from testkit.server import V3Client, poll

SECRETS = ("vault-7", "PELICAN", "zsh-extra")
FIRST = "The vault host is vault-7. My favourite shell is zsh-extra."


def leaks(text: str) -> list[str]:
    """The planted secrets found in ``text``."""
    return [s for s in SECRETS if s in text]


async def say(c: V3Client, text: str) -> None:
    """One chat turn, run to its TURN_END."""
    reply = await c.call(MsgType.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"])
    assert events[-1].type == MsgType.TURN_END, events[-1].body


async def plant_secrets_until_summarized(srv: Any, c: V3Client) -> str:
    """Tell the client's session the SECRETS (FIRST names the session), chat on until the session
    has a summary and the user a long-term memory item; the session id."""
    first = c.hello["session"]["session_id"]
    await say(c, FIRST)
    await say(c, "remember the code word PELICAN for the backup job")
    for i in range(4):
        await say(c, f"check disk usage on web{i}")
    memory = srv.services.memory

    async def summarized() -> bool:
        await memory.wait_idle()
        rec = await srv.store.get(first)
        return bool(rec.summaries) and bool(await memory.user_memory.list("local"))
    await poll(summarized, what="a summary and a long-term memory item")
    return first


async def forget(c: V3Client, session_id: str, how: str) -> str:
    """Clear (``"clear"``, ``"clear purge"``) or purge (``"purge"``) the session; the session the
    client goes on in (a new one after a purge)."""
    if how == "purge":
        await c.call(MsgType.SESSION_PURGE, session_id=session_id)
        return (await c.call(MsgType.SESSION_NEW))["session"]["session_id"]
    await c.call(MsgType.CLEAR_REQUEST, session_id=session_id, purge=how == "clear purge")
    return session_id

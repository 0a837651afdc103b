"""Long-term user memory across nodes (issues 17 and 18): what a user says on node A reaches a prompt
on node B, what they forget on node B is gone on node A, and nothing of it reaches another user.
Two real nodes on one embedded PostgreSQL, the real memory layer, loopback TCP."""
from __future__ import annotations

from protocol import MsgType as T
from testkit.server import V3Client, poll

from .conftest import node

USERS = [("alice", "token-a"), ("bob", "token-b")]


async def turn_context(c: V3Client, text: str) -> dict:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"])
    assert events[-1].type == T.TURN_END, events[-1].body
    return events[-1].body["context"]


async def test_user_memory_is_one_truth_across_nodes(tmp_path, pg_url):
    async with node(tmp_path, pg_url, "a", memory=None, users=USERS) as a, \
            node(tmp_path, pg_url, "b", memory=None, users=USERS) as b:
        alice_a = await V3Client.connect((a.host, a.port), token="token-a")
        alice_b = await V3Client.connect((b.host, b.port), token="token-a")
        bob_b = await V3Client.connect((b.host, b.port), token="token-b")
        assert (await alice_b.call(T.MEMORY_LIST))["items"] == []      # node b caches alice's empty memory

        await turn_context(alice_a, "The prod DB host is db-prod-42.")

        async def listed(c: V3Client) -> list[dict]:
            return (await c.call(T.MEMORY_LIST))["items"]

        async def learned_on_b() -> bool:
            return [i["text"] for i in await listed(alice_b)] == ["The prod DB host is db-prod-42."]
        await poll(learned_on_b, timeout=20)         # learned on node a, after its turn; read by node b
        fact = (await listed(alice_b))[0]["id"]
        await alice_b.call(T.SESSION_NEW)
        context = await turn_context(alice_b, "ssh into the prod database host")
        assert context["memory_items"] == [fact]     # node b's prompt carries what node a learned
        assert await listed(bob_b) == []
        assert (await turn_context(bob_b, "ssh into the prod database host"))["memory_items"] == []

        assert (await alice_b.call(T.MEMORY_FORGET, item_id=fact))["item_id"] == fact

        async def forgotten_on_a() -> bool:
            return await listed(alice_a) == []
        await poll(forgotten_on_a, timeout=20)
        await alice_a.call(T.SESSION_NEW)
        assert (await turn_context(alice_a, "ssh into the prod database host"))["memory_items"] == []
        for c in (alice_a, alice_b, bob_b):
            await c.close()

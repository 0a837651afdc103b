"""History-search answers are not found again: a turn whose answer is a listing of earlier messages
(``metadata.history_listing``, set by the offline agent) is neither a history_search hit nor recalled
into the prompt, so asking the same history question again finds what the user said, not the copies
of the question and of its earlier answers."""
from __future__ import annotations

from memory_testlib import OfflineStub
from server.memory import MemoryConfig, MemoryManager
from server.memory.recall import turn_docs
from storage.models import ChatMessage

USER = "ops"
QUESTION = "what did I say about the staging server before?"
LISTING = {"history_listing": True}


def test_turn_docs_leave_history_listings_out_whole():
    msgs = [ChatMessage(1, "user", "the staging server is stage-7"),
            ChatMessage(2, "assistant", "Noted."),
            ChatMessage(3, "user", QUESTION),
            ChatMessage(4, "assistant", "Found 1 earlier message(s) about 'staging server': ...", metadata=LISTING),
            ChatMessage(5, "user", "thanks")]
    docs, upto = turn_docs("s", msgs, final=False)
    assert [d.message_id for d in docs] == [1] and upto == 4     # consumed, not indexed; 5 still runs
    docs, upto = turn_docs("s", msgs, final=True)
    assert [d.message_id for d in docs] == [1, 5] and upto == 5


async def _ask_history(store, mm, sid: str) -> None:
    user = await store.append(sid, "user", QUESTION)
    await mm.build_context(sid, USER, user, "chat-model")
    hits = await mm.search(USER, "staging server")
    listing = "Found %d earlier message(s) about 'staging server':\n" % len(hits) + "\n".join(
        f"- {h['snippet']}" for h in hits)
    await store.append(sid, "assistant", listing, metadata=LISTING)
    await mm.after_turn(sid, USER)


async def test_asking_the_same_history_question_again_still_finds_the_statement(store):
    mm = MemoryManager(MemoryConfig(), store, OfflineStub(), None, "SYS")
    said = (await store.create(USER)).session_id
    stated = await store.append(said, "user", "Remember that the staging server is stage-7.")
    await store.append(said, "assistant", "Noted:\n- The staging server is stage-7.")
    await mm.after_turn(said, USER)
    for _ in range(6):                                       # each in a new session, as `ask --new` does
        await _ask_history(store, mm, (await store.create(USER)).session_id)
    hits = await mm.search(USER, "staging server")
    assert [(h["session_id"], h["message_id"]) for h in hits] == [(said, stated.id)]
    assert not any("Found" in h["snippet"] or "what did I say" in h["snippet"] for h in hits)


async def test_the_prompts_recall_leaves_history_listings_out(store):
    mm = MemoryManager(MemoryConfig.from_dict({"context": {"recent_turns": 1}}), store, OfflineStub(), None, "SYS")
    sid = (await store.create(USER)).session_id
    await store.append(sid, "user", "Remember that the staging server is stage-7.")
    await store.append(sid, "assistant", "Noted:\n- The staging server is stage-7.")
    await mm.after_turn(sid, USER)
    for _ in range(6):                                       # the same history question, in the same session
        await _ask_history(store, mm, sid)
    user = await store.append(sid, "user", "which host is the staging server again?")
    ctx = await mm.build_context(sid, USER, user, "chat-model")
    recalled = [m["content"] for m in ctx.messages if m["role"] == "system" and m["content"].startswith("Excerpts")]
    assert recalled and "stage-7" in recalled[0]
    assert "Found" not in recalled[0] and "what did I say" not in recalled[0]

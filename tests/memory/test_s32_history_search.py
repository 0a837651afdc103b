"""Review s32: "what did I ask about nginx earlier" lists as about nginx only the messages that say
nginx themselves, not the turns around them (a recall document carries its neighbours' words, at
0.6/0.3 before and 0.4/0.2 after, which is right for the prompt's recall but not for a listing).
The history_search tool's index search (``own_match``) and the offline agent's answer, the latter
through a real server over loopback."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson

from kb_wire.kbwire import chat, connect, wired_server
from protocol import MsgType
from server.agent import answers
from server.memory import recall
from server.memory.recall import RecallIndex, TurnDoc
from storage.models import ToolCall

SAID = ["which kernel version is running on the web host?",
        "how do I reload the nginx config without downtime?",
        "and how do I rotate the access logs weekly?",
        "what is a sensible swap size for 8 GB of RAM?"]


def index(day: datetime) -> RecallIndex:
    idx = RecallIndex()
    docs = [TurnDoc("s1", 2 * i + 1, 2 * i + 2, (day + timedelta(hours=i)).isoformat(), text, "Noted.")
            for i, text in enumerate(SAID)]
    docs.append(TurnDoc("s2", 1, 2, (day - timedelta(days=3)).isoformat(), "lunch plans for friday", "Noted."))
    idx.add_turns("s1", docs[:4], 8)
    idx.add_turns("s2", docs[4:], 2)
    return idx


def test_the_tools_search_keeps_only_turns_that_say_the_words_themselves():
    now = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)
    idx = index(now - timedelta(hours=6))
    prompt_recall = [d.user_text for d, _ in idx.search("nginx", 5, now=now)]
    assert len(prompt_recall) == 4 and prompt_recall[0] == SAID[1]      # the neighbours too: unchanged
    own = [d.user_text for d, _ in idx.search("nginx", 5, now=now, own_match=True)]
    assert own == [SAID[1]]
    assert [d.user_text for d, _ in idx.search("nginx", 5, session_id="s1", own_match=True)] == [SAID[1]]
    assert idx.search("postgres", 5, own_match=True) == []
    # a relative day counts as the turn's own: "what did we talk about 3 days ago"
    assert [d.user_text for d, _ in idx.search("3 days ago", 5, now=now, own_match=True)] == ["lunch plans for friday"]


def history(hits: list[dict], query: str = "nginx") -> str:
    call = ToolCall(id="c1", tool_name="history_search", status="success",
                    result=orjson.dumps({"query": query, "scope": "all", "hits": hits}).decode())
    return answers.render(call, zh=False)


def test_the_answer_says_about_only_for_hits_that_name_the_topic():
    hit = {"session_id": "s1", "title": "ops", "role": "user", "time": "2026-11-27T10:00:00+00:00"}
    own = {**hit, "snippet": f"{SAID[1]} / Noted."}
    around = [{**hit, "snippet": f"{t} / Noted."} for t in (SAID[0], SAID[2])]
    text = history([own, *around])
    assert text.startswith("Found 1 earlier message(s) about 'nginx':\n- [ops] user ")
    head, rest = text.split("\nRelated earlier message(s) from around them, not naming 'nginx' themselves:\n")
    assert SAID[1] in head and SAID[0] not in head and SAID[2] not in head
    assert SAID[0] in rest and SAID[2] in rest
    only_around = history(around)
    assert only_around.startswith("No earlier message names 'nginx'; 2 related earlier message(s):")
    assert history([own]) == f"Found 1 earlier message(s) about 'nginx':\n- [ops] user 2026-11-27 10:00 UTC: {SAID[1]} / Noted."


async def test_asking_what_i_asked_about_nginx_lists_the_one_message_over_loopback(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for text in SAID:
            await chat(c, text)
        await c.call(MsgType.SESSION_NEW)
        end, _ = await chat(c, "what did I ask about nginx earlier")
        content = end["message"]["content"]
        assert content.startswith("Found 1 earlier message(s) about 'nginx':\n")
        about = content.partition("\nRelated earlier message(s)")[0]
        said = [line.split(" UTC: ", 1)[1] for line in about.splitlines()[1:]]    # (the title is the 1st message)
        assert len(said) == 1 and said[0].startswith(SAID[1])
        assert SAID[0] not in said[0] and SAID[2] not in said[0]
        hits = await srv.services.memory.search("alice", "nginx")          # the tool's search, as the tool calls it
        assert hits and hits[0]["snippet"].startswith(SAID[1])
        await c.close()


def test_query_match_is_by_words_not_substrings():
    m = recall.QueryMatch("nginx")
    assert m.text_matches("reload nginx now") and not m.text_matches("the engine is fine")

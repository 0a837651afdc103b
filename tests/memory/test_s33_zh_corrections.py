"""S33 (review zh, F1/F3): Chinese corrections to remembered facts and language preferences.

1. A Chinese operator writes a Latin value between spaces: "日志服务器不是 log-1 了" takes the value
   back and "日志服务器换成 log-2 了" is a change (before, both were answered as memory questions that
   repeated the withdrawn value, and nothing was learned); any noun can change ("跳板机换成 jump-2 了",
   "堡垒机换成bastion-2了"), never a pronoun or a person doing something.
2. A one-sentence correction replaces the old value: "the prod DB host is not db-prod-41 anymore, it
   is db-prod-43", "日志服务器不是 log-1 了，换成 log-2 了" (before, kept beside the old one).
3. A fact of several statements about different things is kept as those statements, so a later
   statement replaces only its own part: "生产数据库现在是 db-prod-2" replaces "生产数据库是 db-prod-1" of
   "生产数据库是 db-prod-1，备份在杭州机房" and leaves "备份在杭州机房".
4. "把回答改成英文" and "switch the answers to English" are language preferences.

Over TCP: the offline agent against the real server (``server.app.Server``, rules, no model).
"""
from __future__ import annotations

import pytest

from protocol import MsgType as T
from server.agent import knowledge_route
from server.app import Server
from server.memory.distill import distill_rules, same_subject, takes_back
from testkit.server import V3Client, make_config, poll


# -- 1. spaces around a Latin value, any noun subject -------------------------------------------------
@pytest.mark.parametrize("text, said", [
    ("日志服务器不是 log-1 了", "日志服务器是 log-1"),
    ("日志服务器不是log-1了", "日志服务器是log-1"),
    ("跳板机不是 jump-1 了", "跳板机是 jump-1"),
    ("日志服务器已经不是 log-1 了。", "日志服务器是 log-1"),
])
def test_a_value_between_spaces_that_no_longer_holds_is_taken_back(text, said):
    assert takes_back(text) == [("no longer", said)]
    assert distill_rules(text) == []
    assert knowledge_route.statement_items(text) == [("no longer", said)]     # a statement, never a question


@pytest.mark.parametrize("text, key", [
    ("日志服务器换成 log-2 了", "fact:日志服务器是"),
    ("日志服务器换成log-2了", "fact:日志服务器是"),
    ("跳板机换成 jump-2 了", "fact:跳板机是"),
    ("堡垒机换成bastion-2了", "fact:堡垒机是"),
    ("我们把跳板机换成 jump-2 了", "fact:跳板机是"),
    ("日志服务器换成了 log-2", "fact:日志服务器是"),
])
def test_a_change_of_any_noun_to_an_identifier_is_kept(text, key):
    assert distill_rules(text) == [("fact", text)]
    assert same_subject("fact", text) == key
    assert knowledge_route.statement_items(text) == [("fact", text)]


@pytest.mark.parametrize("text", ["我不是张三了", "他把车换成宝马了", "天气变成晴天了", "我不是张三了，是李四",
                                  "日志服务器不是 log-1 了吗", "日志服务器换成 log-2 了吗", "把日志服务器换成 log-2"])
def test_pronouns_people_chatter_questions_and_requests_are_not_kept(text):
    assert distill_rules(text) == [] and takes_back(text) == [], text


# -- 2. a correction in one sentence ------------------------------------------------------------------
@pytest.mark.parametrize("old, correction", [
    ("The prod DB host is db-prod-41.", "the prod DB host is not db-prod-41 anymore, it is db-prod-43"),
    ("The prod DB host is db-prod-41.", "The prod DB host is no longer db-prod-41, it's db-prod-43 now."),
    ("日志服务器是 log-1", "日志服务器不是 log-1 了，换成 log-2 了"),
    ("日志服务器是 log-1", "日志服务器不是 log-1 了，现在是 log-2"),
    ("数据库在杭州", "数据库不在杭州了，迁到上海了"),
    ("My son is 5", "My son is not 5 anymore, he is 6"),
])
def test_a_one_sentence_correction_is_about_what_the_old_statement_is_about(old, correction):
    assert distill_rules(correction) == [("fact", correction)]
    assert same_subject("fact", correction) == same_subject("fact", old) is not None


# -- 3. a fact of several statements --------------------------------------------------------------------
def test_a_fact_of_several_statements_is_kept_as_those_statements():
    assert distill_rules("记住生产数据库是 db-prod-1，备份在杭州机房") == [("fact", "生产数据库是 db-prod-1"),
                                                                 ("fact", "备份在杭州机房")]
    assert knowledge_route.statement_items("记住生产数据库是 db-prod-1，备份在杭州机房") == \
        [("fact", "生产数据库是 db-prod-1"), ("fact", "备份在杭州机房")]
    assert same_subject("fact", "生产数据库是 db-prod-1") == same_subject("fact", "生产数据库现在是 db-prod-2")
    for whole in ("生产数据库在上海，不是杭州", "The prod DB host is db-prod-47, not db-prod-46",
                  "我的名字是张三，我在阿里巴巴工作", "The DB host is db-1, port 5432"):
        assert [text for _, text in distill_rules(whole)] == [whole], whole     # a clause with no subject of its own


# -- 4. switching the answers' language ---------------------------------------------------------------
@pytest.mark.parametrize("text", ["把回答改成英文", "回复换成中文吧", "改用英文回答", "switch the answers to English",
                                  "Change your replies to Chinese."])
def test_switching_the_answers_to_a_language_is_a_language_preference(text):
    assert distill_rules(text) == [("preference", text)]
    assert same_subject("preference", text) == same_subject("preference", "以后用中文回答") == \
        "preference:answer language"


def test_translating_a_text_or_refusing_a_language_is_no_language_preference():
    assert distill_rules("把这段话改成英文") == []
    assert same_subject("preference", "不要把回答改成英文") == "preference:not answer language:english"


# -- over TCP: the offline agent and the user memory ----------------------------------------------------
async def _turn(c: V3Client, text: str) -> dict:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return events[-1].body["message"]


async def _items(c: V3Client) -> list[str]:
    return sorted(i["text"] for i in (await c.call(T.MEMORY_LIST))["items"])


async def test_a_chinese_correction_is_noted_and_answers_the_next_question_over_tcp(tmp_path):
    srv = Server(make_config(tmp_path))
    addr = await srv.start()
    try:
        c = await V3Client.connect(addr)
        assert (await _turn(c, "记住日志服务器是 log-1"))["metadata"]["intents"] == ["note"]
        msg = await _turn(c, "日志服务器不是 log-1 了")            # takes it back: no memory answer
        assert msg["metadata"]["intents"] == ["note"], msg
        assert not msg["content"].startswith("根据你之前告诉我的") and "已不再成立" in msg["content"]
        msg = await _turn(c, "日志服务器换成 log-2 了")
        assert msg["metadata"]["intents"] == ["note"] and "日志服务器换成 log-2 了" in msg["content"], msg
        msg = await _turn(c, "跳板机换成 jump-2 了")
        assert msg["metadata"]["intents"] == ["note"], msg

        async def learned() -> bool:
            return await _items(c) == ["日志服务器换成 log-2 了", "跳板机换成 jump-2 了"]
        await poll(learned, timeout=15)
        await c.call(T.SESSION_NEW)                                   # another session: the user memory
        msg = await _turn(c, "日志服务器是哪台")
        assert msg["metadata"]["intents"] == ["memory"] and "log-2" in msg["content"] and "log-1" not in msg["content"]
        await c.close()
    finally:
        await srv.stop()


async def test_corrections_replace_only_what_they_are_about_over_tcp(tmp_path):
    srv = Server(make_config(tmp_path))
    addr = await srv.start()
    try:
        c = await V3Client.connect(addr)
        await _turn(c, "记住生产数据库是 db-prod-1，备份在杭州机房")
        await _turn(c, "The prod DB host is db-prod-41.")
        await _turn(c, "以后用中文回答")
        await c.call(T.SESSION_NEW)
        await _turn(c, "生产数据库现在是 db-prod-2")
        await _turn(c, "the prod DB host is not db-prod-41 anymore, it is db-prod-43")
        msg = await _turn(c, "把回答改成英文")
        assert msg["metadata"]["intents"] == ["note"], msg

        async def replaced() -> bool:
            return await _items(c) == sorted(["备份在杭州机房", "生产数据库现在是 db-prod-2", "把回答改成英文",
                                              "the prod DB host is not db-prod-41 anymore, it is db-prod-43"])
        await poll(replaced, timeout=15)
        await c.call(T.SESSION_NEW)
        msg = await _turn(c, "生产数据库是什么？")
        assert "db-prod-2" in msg["content"] and "db-prod-1" not in msg["content"], msg
        msg = await _turn(c, "What is the prod DB host?")
        assert "db-prod-43" in msg["content"] and "is db-prod-41." not in msg["content"], msg
        await c.close()
    finally:
        await srv.stop()

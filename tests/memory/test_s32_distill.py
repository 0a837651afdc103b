"""Long-term memory distillation (session 32): the words that ask to keep something are taken off
every item that states something, in English and Chinese, and the distiller says which path (the
summary model or the rules) produced its items."""
from __future__ import annotations

import logging

import pytest

from memory_testlib import ScriptedSummarizer
from server.memory.distill import distill_rules, subject_key
from server.memory.distill_model import SOURCE_MODEL, SOURCE_RULES, distill_by_model, distill_with_model

# (what the user wrote, the items kept): the request wording goes whenever a statement follows it
KEPT = [
    # before, these were stored word for word, "remember that" and all
    ("remember that bob's printer is on floor 3", [("fact", "Bob's printer is on floor 3")]),
    ("Remember that bob's printer is on floor 3.", [("fact", "Bob's printer is on floor 3.")]),
    ("Please remember: bob's printer is on floor 3", [("fact", "Bob's printer is on floor 3")]),
    ("remember, bob's printer is on floor 3", [("fact", "Bob's printer is on floor 3")]),
    ("FYI remember that bob's printer is on floor 3", [("fact", "Bob's printer is on floor 3")]),
    ("note that the office wifi is guest-5", [("fact", "The office wifi is guest-5")]),
    ("please note that the vpn endpoint is vpn-3.corp", [("fact", "The vpn endpoint is vpn-3.corp")]),
    ("Don't forget that the build machine is on floor 2", [("fact", "The build machine is on floor 2")]),
    ("Don’t forget that the build machine is on floor 2", [("fact", "The build machine is on floor 2")]),
    ("remember the milk is in the fridge", [("fact", "The milk is in the fridge")]),
    ("Remember: we deploy on Fridays", [("fact", "We deploy on Fridays")]),
    ("记住鲍勃的打印机在三楼", [("fact", "鲍勃的打印机在三楼")]),
    ("请记住：鲍勃的打印机在三楼", [("fact", "鲍勃的打印机在三楼")]),
    ("记住，我女儿今年五岁", [("fact", "我女儿今年五岁")]),
    ("帮我记住：会议室在五楼", [("fact", "会议室在五楼")]),
    ("请帮我记住老板的生日是三月五日", [("fact", "老板的生日是三月五日")]),
    ("你记住，我住在北京", [("fact", "我住在北京")]),
    ("记住我们用PostgreSQL", [("fact", "我们用PostgreSQL")]),
    # never kept before at all although the user asked
    ("keep in mind that alice's laptop is a mac", [("fact", "Alice's laptop is a mac")]),
    ("记一下：小王的电脑在三楼", [("fact", "小王的电脑在三楼")]),
    ("记下来：测试环境在上海", [("fact", "测试环境在上海")]),
    # as before: stripped already (a fact or preference by itself)
    ("The staging server is stage-7.internal", [("fact", "The staging server is stage-7.internal")]),
    ("remember that the staging server is stage-7.internal", [("fact", "The staging server is stage-7.internal")]),
    ("remember that I prefer short answers", [("preference", "I prefer short answers")]),
    ("记住预发服务器是 stage-7.internal", [("fact", "预发服务器是 stage-7.internal")]),
    ("请记住我的生日是五月三日", [("fact", "我的生日是五月三日")]),
    # a request to do something is no statement: kept whole, as before
    ("Remember to check the disk", [("fact", "Remember to check the disk")]),
    ("remember not to restart prod", [("fact", "remember not to restart prod")]),
    ("记住检查磁盘", [("fact", "记住检查磁盘")]),
    ("记住，检查磁盘", [("fact", "记住，检查磁盘")]),
    # the other rules still hold after the request wording: nothing kept
    ("remember that my password is hunter2", []),
    ("记住：我的密码是123", []),
    ("remember that bob's printer might be on floor 3", []),
    ("remember that bob's printer is on floor 3?", []),
    ("remember that bob said the printer is on floor 3", []),
    ("你记住了吗", []),
    ("remember that", []),
    ("记住", []),
]


@pytest.mark.parametrize("text,items", KEPT)
def test_the_request_to_keep_is_left_out_of_every_statement(text, items):
    assert distill_rules(text) == items


def test_a_kept_statement_corrects_the_same_subject_however_it_was_asked():
    # the item's subject is the statement's, not "remember that ..." (a later correction replaces it)
    assert subject_key("fact", "remember that the prod DB host is db-1") == \
        subject_key("fact", "The prod DB host is db-2") == "fact:prod db host"
    assert subject_key("fact", "记一下：生产数据库在杭州") == subject_key("fact", "生产数据库在上海")


@pytest.mark.parametrize("answer", ["not json at all", "[{\"kind\": \"fact\"}]", ""])
async def test_an_unusable_model_answer_gives_the_rules_items_labelled_rules(answer):
    agent = ScriptedSummarizer([answer])
    found, source = await distill_by_model(agent, "small", "Our backup host is bk-3.")
    assert source == SOURCE_RULES == "rules"
    assert found == distill_rules("Our backup host is bk-3.") == [("fact", "Our backup host is bk-3.")]
    assert agent.calls and agent.calls[0][1] == "small"


async def test_a_failing_model_gives_the_rules_items_labelled_rules(caplog):
    agent = ScriptedSummarizer([RuntimeError("model endpoint down")])
    with caplog.at_level(logging.WARNING, logger="nplt.memory"):
        found, source = await distill_by_model(agent, "small", "Our backup host is bk-3.")
    assert (found, source) == ([("fact", "Our backup host is bk-3.")], SOURCE_RULES)
    assert any("model endpoint down" in r.getMessage() for r in caplog.records)


async def test_the_models_items_are_labelled_model():
    agent = ScriptedSummarizer(['[{"kind": "fact", "text": "The backup host is bk-3"}]'])
    found, source = await distill_by_model(agent, "small", "Our backup host is bk-3.")
    assert (found, source) == ([("fact", "The backup host is bk-3")], SOURCE_MODEL)
    assert SOURCE_MODEL == "model"
    # the items-only form is unchanged
    agent = ScriptedSummarizer(["not json at all"])
    assert await distill_with_model(agent, "small", "Our backup host is bk-3.") == [("fact", "Our backup host is bk-3.")]


@pytest.mark.parametrize("text,kept", [
    ("remember my dentist is Dr. Wu", "My dentist is Dr. Wu"),
    ("remember that our landlord is Mrs. Chen", "Our landlord is Mrs. Chen"),
    ("Our office is on Baker St. 221", "Our office is on Baker St. 221"),
])
def test_a_title_before_a_name_does_not_end_the_sentence(text, kept):
    """(The sentence splitter cut "Dr. Wu" at "Dr.", keeping "My dentist is Dr.")"""
    assert (("fact", kept) in distill_rules(text)), distill_rules(text)


def test_sentences_still_end_at_a_full_stop():
    from server.memory.extractive import sentences
    assert sentences("The host is db-1. Dr. Wu is my dentist. I said no. Done.") == [
        "The host is db-1.", "Dr. Wu is my dentist.", "I said no.", "Done."]

"""The rules of long-term memory (``server.memory.distill``), review s31: a request to forget is never
kept, secrets the filter missed (PIN, pwd, pass, SSN, 身份证, card numbers) are refused, plain
Chinese statements of a system setting are learned, and corrections worded with a parenthetical,
"since ...", "database" for "db", or "not ... anymore" are recognised."""
from __future__ import annotations

import pytest

from server.memory.distill import distill_rules, retracts, subject_key, takes_back
from server.memory.sensitive import mentions_secret


@pytest.mark.parametrize("text, taken", [
    ("Please forget that my home address is 12 Elm Street.", ("forget", "my home address is 12 Elm Street")),
    ("Don't remember that my manager is Bob.", ("forget", "my manager is Bob")),
    ("Stop remembering that my phone number is 555-0100.", ("forget", "my phone number is 555-0100")),
    ("Delete the fact that my manager is Bob.", ("forget", "my manager is Bob")),
    ("Actually, forget that the DB host is db-1.", ("forget", "the DB host is db-1")),
    ("Forget what I said about the DB host.", ("forget", "the DB host")),
    ("Can you forget that the DB host is db-1?", ("forget", "the DB host is db-1")),
    ("别记住我的手机号是13800138000", ("forget", "我的手机号是13800138000")),
    ("请忘记我的家庭住址是朝阳路1号", ("forget", "我的家庭住址是朝阳路1号")),
    ("忘掉我的数据库地址吧。", ("forget", "我的数据库地址")),
    ("The prod DB host is not db-prod-41 anymore.", ("no longer", "The prod DB host is db-prod-41")),
    ("The prod DB host is no longer db-prod-41.", ("no longer", "The prod DB host is db-prod-41")),
    ("生产数据库不在杭州了", ("no longer", "生产数据库在杭州")),
    ("数据库不再是MySQL", ("no longer", "数据库是MySQL")),
])
def test_a_sentence_that_takes_something_back_is_never_kept(text, taken):
    assert distill_rules(text) == []
    assert takes_back(text) == [taken]


@pytest.mark.parametrize("text, kept", [
    ("Don't forget that the DB host is db-1.", [("fact", "The DB host is db-1.")]),   # asks to keep it
    ("忘了告诉你", []),                                                               # "I forgot to tell you"
    ("I forgot my laptop at home.", []),
    ("Remove the old logs from /var/tmp.", []),                                       # a request, no memory
    ("The server is not responding.", [("fact", "The server is not responding.")]),   # (as before: no "anymore")
])
def test_what_only_looks_like_taking_back_is_not(text, kept):
    assert takes_back(text) == []
    assert distill_rules(text) == kept


def test_a_message_can_take_back_and_state_at_once():
    text = "Forget that my address is 1 Oak Road. My address is 2 Elm Street."
    assert takes_back(text) == [("forget", "my address is 1 Oak Road")]
    assert distill_rules(text) == [("fact", "My address is 2 Elm Street.")]


@pytest.mark.parametrize("taken, kind, text, named", [
    (("forget", "my home address is 12 Elm Street"), "fact", "My home address is 12 Elm Street.", True),
    (("forget", "my home address"), "fact", "My home address is 12 Elm Street.", True),          # a subject alone
    (("forget", "the DB host"), "fact", "Our DB host: db-1", True),
    (("forget", "the DB host"), "fact", "The prod DB host is db-prod-41.", False),                # another subject
    (("forget", "our DB host is db-1"), "fact", "Actually, the database host is db-1 now.", True),  # subject + value
    (("forget", "the prod DB host is db-prod-41"), "fact", "The prod DB host is db-prod-42.", False),  # another value
    (("forget", "我的数据库地址"), "fact", "数据库地址是10.0.0.1", True),
    (("forget", "我的手机号是13800138000"), "fact", "我的手机号是13800138000", True),
    (("no longer", "生产数据库在杭州"), "fact", "我们的生产数据库在杭州。", True),
    (("no longer", "The prod DB host is db-prod-41"), "fact", "The prod DB host is db-prod-42.", False),
    (("forget", "it"), "fact", "It is late.", False),
])
def test_which_items_a_sentence_takes_back(taken, kind, text, named):
    assert retracts(taken)(kind, text) is named


@pytest.mark.parametrize("text", [
    "My bank PIN is 4821.", "Our wifi pwd is hunter22.", "The prod DB pass is swordfish9.",
    "我的身份证号是110101199003071234", "我的银行卡号是6222021234567890123", "My SSN is 078-05-1120.",
    "My credit card number is 4111 1111 1111 1111.", "The card is 4111-1111-1111-1111",
    "The backup card is 4111 1111 1111 1111", "Our code is 6222021234567890123",        # the shapes alone
    "His id is 078-05-1120", "The CVV is 123", "PIN码是1234", "我的支付密码是123456", "门禁口令是芝麻开门",
])
def test_secrets_are_never_kept(text):
    assert mentions_secret(text)
    assert distill_rules(text) == []


@pytest.mark.parametrize("text", [
    "The app port is 8080.", "The prod DB version is 15.4.2", "The prod DB host is 10.0.0.12",
    "The on-call number is +86 138 0013 8000", "My phone number is 13800138000", "Our desk extension is 5521",
    "Our ports are 5432 8080 9090 9100", "The AWS account is 123456789012", "The build id is 20240101",
    "Tests pass on CI", "Please pin the versions in your answers",
])
def test_ordinary_numbers_are_no_secrets(text):
    assert not mentions_secret(text)


@pytest.mark.parametrize("text, key", [
    ("生产数据库在杭州。", "fact:生产数据库在"),
    ("预发服务器是 stage-7.internal", "fact:预发服务器是"),
    ("生产数据库的端口是5432", "fact:生产数据库端口是"),
    ("数据库主机是db-1", "fact:数据库主机是"),
    ("生产数据库的地址是10.0.0.1", "fact:生产数据库地址是"),     # 的 or not: one subject
    ("生产数据库地址是10.0.0.3", "fact:生产数据库地址是"),
])
def test_plain_chinese_system_settings_are_learned(text, key):
    assert distill_rules(text) == [("fact", text)]
    assert subject_key("fact", text) == key


@pytest.mark.parametrize("text", ["服务器在重启", "数据库在迁移中", "生产数据库在哪？"])
def test_what_a_system_is_doing_or_a_question_is_not(text):
    assert distill_rules(text) == []


@pytest.mark.parametrize("text, key", [
    ("The prod DB host is now db-prod-42 (moved last week).", "fact:prod db host"),
    ("The prod DB host is db-prod-42 since yesterday.", "fact:prod db host"),
    ("The prod database host is db-prod-43.", "fact:prod db host"),     # the analyzer's db/database
    ("The production DB host is db-prod-44.", "fact:prod db host"),
    ("The DB host is db-1 and the port is 5432.", None),               # two statements: no one subject
    ("My son is a doctor.", None),
])
def test_corrections_are_recognised_in_more_wordings(text, key):
    assert subject_key("fact", text) == key


# review s31 round 2: what a request to forget names


@pytest.mark.parametrize("text", [
    "Please forget everything you know about me.", "Forget everything.", "Forget everything about me",
    "Don't remember anything about me", "Forget all about me", "忘掉关于我的一切。", "忘掉所有", "忘掉你记住的所有内容",
])
def test_a_request_to_forget_everything_takes_every_item(text):
    [taken] = takes_back(text)
    named = retracts(taken)
    assert all(named(kind, item) for kind, item in [("fact", "My name is Bob."), ("fact", "生产数据库在杭州"),
                                                     ("preference", "Please always answer in Chinese")])


@pytest.mark.parametrize("text, kind, item, named", [
    ("忘掉Redis地址", "fact", "Redis地址是10.0.0.5", True),                    # a subject with Latin letters
    ("忘掉Redis地址", "fact", "Redis的地址是10.0.0.5", True),
    ("请忘记MySQL端口", "fact", "MySQL端口是3306", True),
    ("请忘记MySQL端口", "fact", "Redis地址是10.0.0.5", False),
    ("Forget that I asked you to answer in Chinese.", "preference", "Please always answer in Chinese", True),
    ("Forget that I asked you to answer in Chinese.", "preference", "Answer in English", False),
    ("忘掉我说的用中文回答", "preference", "以后请用中文回答", True),
    ("Forget my nickname", "fact", "Call me Bobby", True),
    ("忘掉我的昵称", "fact", "叫我小王", True),
    ("Forget my address", "fact", "My home address is 12 Elm Street", True),   # one of the user's own addresses
    ("忘掉我的地址", "fact", "我的家庭地址是朝阳路1号", True),
    ("Forget the address", "fact", "My home address is 12 Elm Street", False),  # not "my": the subject itself
    ("忘掉我的地址", "fact", "数据库地址是10.0.0.1", False),                     # not the user's own
    ("Forget what I said about the DB host", "fact", "The DB host port is 5432", False),
    ("Forget it", "fact", "It is late.", False),
])
def test_what_a_request_to_forget_names(text, kind, item, named):
    [taken] = takes_back(text)
    assert retracts(taken)(kind, item) is named


def test_everything_i_said_about_a_subject_names_the_subject():
    assert takes_back("Forget everything I said about the DB host.") == [("forget", "the DB host")]
    assert takes_back("Forget all I told you about the nginx port") == [("forget", "the nginx port")]

"""The rule distiller (``server.memory.distill``): which sentences are kept, as what text, and which
later statement replaces which earlier one (``subject_key``).

Each table has the cases of one rule: unrelated statements that must not replace each other,
corrections worded with a leading "actually" / "correction:" / "其实" / "is now" or as a change
("changed to", "We moved ... to", "改成…了", "迁到…了"), questions, statements not made as true
(hedged, negated, requests to check, what someone else said) and secrets that must not be kept, and
the real statements and corrections that already worked and still must."""
from __future__ import annotations

import pytest

from server.memory.distill import distill_rules, subject_key


def replaces(older: str, newer: str) -> bool:
    """Each message gives one item; the newer item replaces the older one (same subject key)."""
    [(old_kind, old_text)] = distill_rules(older)
    [(new_kind, new_text)] = distill_rules(newer)
    key = subject_key(new_kind, new_text)
    return key is not None and key == subject_key(old_kind, old_text)


@pytest.mark.parametrize("older, newer", [
    # Chinese: the subject is not cut at a 是/在/用 inside a word, and "我们用 X" is not "<subject> is X"
    ("我们用PostgreSQL", "我们用Kubernetes部署"),
    ("我的常用shell是zsh", "我的常用编辑器是vim"),
    # a bare pronoun is not a subject ("I am X" has no key either)
    ("我是张三。", "我是后端工程师。"),
    ("我在阿里巴巴工作。", "我在杭州的团队工作。"),
    # a negative language preference stands beside the positive one of another language
    ("Please answer in Chinese.", "Never answer in French."),
    ("Please answer in Chinese.", "Please don't reply in English."),
    ("以后用中文回答。", "不要用英文回答。"),
    ("Always answer in English.", "别用日语回复。"),
    ("Never answer in French.", "Never reply in German."),
    ("Please answer in Chinese.", "Always answer in bullet points."),        # not a language
    # a conditional preference does not replace the standing one
    ("Please answer in Chinese.", "If I write in English, answer in English."),
])
def test_unrelated_statements_stand_beside_each_other(older, newer):
    assert not replaces(older, newer)


@pytest.mark.parametrize("older, newer", [
    # a leading discourse marker is not part of the subject
    ("The prod DB host is db-prod-41.", "Actually, the prod DB host is db-prod-42."),
    ("The prod DB host is db-prod-41.", "As I said, the prod DB host is db-prod-42."),
    ("The prod DB host is db-prod-41.", "Actually the prod DB host is db-prod-42."),
    ("The prod DB host is db-prod-41.", "Correction: the prod DB host is db-prod-43."),
    ("The prod DB host is db-prod-41.", "Update: the prod DB host is db-prod-43."),
    ("The prod DB host is db-prod-41.", "FYI the prod DB host is db-prod-43."),
    ("The prod DB host is db-prod-41.", "Btw, the prod DB host is db-prod-44."),
    ("The prod DB host is db-prod-41.", "Oh and the prod DB host is db-prod-44."),
    ("The prod DB host is db-prod-41.", "Sorry, the prod DB host is db-prod-44."),
    ("The prod DB host is db-prod-41.", "Sorry, my mistake: the prod DB host is db-prod-44."),
    ("The prod DB host is db-prod-41.", "Update: remember that the prod DB host is db-prod-45."),
    ("Actually, the prod DB host is db-prod-42.", "Correction: the prod DB host is db-prod-43."),
    # "is now X" is "is X"
    ("The prod DB host is db-prod-41.", "The prod DB host is now db-prod-42."),
    ("My DB port is 5432.", "My DB port is currently 6432."),
    # Chinese markers and 现在
    ("我们的数据库在杭州。", "其实我们的数据库在上海。"),
    ("我们的数据库在杭州。", "更正：我们的数据库在上海。"),
    ("我们的数据库在杭州。", "更新：我们的数据库在上海"),
    ("我们的数据库在杭州。", "纠正一下，我们的数据库在上海。"),
    ("我们的数据库在杭州。", "对了，我们的数据库在上海。"),
    ("我们的数据库在杭州。", "我们的数据库现在在上海。"),
    # a change: "changed to", "We moved ... to", "改成…了", "迁到…了"
    ("我们的生产数据库在杭州。", "生产数据库改成上海了。"),
    ("我们的生产数据库在杭州。", "我们的生产数据库已经迁到上海了。"),
    ("我们的生产数据库在杭州。", "我们把生产数据库迁到上海了。"),
    ("我们的数据库在杭州。", "我们的数据库已经从杭州迁到上海了。"),
    ("我们的数据库是MySQL。", "我们的数据库换成PostgreSQL了。"),
    ("我的名字是张三", "我的名字改成李四了。"),
    ("The prod DB host is db-prod-41.", "The prod DB host changed to db-prod-43."),
    ("The prod DB host is db-prod-41.", "The prod DB host changed from db-prod-41 to db-prod-43."),
    ("The prod DB host is db-prod-41.", "The prod DB host has been moved to db-prod-50."),
    ("The prod DB host is db-prod-41.", "The prod DB host was switched over to db-prod-51 last night."),
    ("The prod DB host is db-prod-41.", "We moved the prod DB host to db-prod-44"),
    ("The prod DB host is db-prod-41.", "We moved the prod DB host to db-prod-44 yesterday."),
    ("The prod DB host is db-prod-41.", "We've migrated the prod DB host to db-prod-52."),
    ("My editor is vim.", "I changed my editor to emacs."),
    # "my"/"our"/"我们的" are not part of the subject
    ("Our CI runner host is ci-1.", "Correction: the CI runner host is ci-2 now."),
    ("The CI runner host is ci-1.", "Our CI runner host is ci-2."),
    ("My name is Alice.", "Actually, my name is Alicia."),
    # "<value>, not <old>"
    ("The prod DB host is db-prod-46.", "The prod DB host is db-prod-47, not db-prod-46."),
    ("The prod DB host is db-prod-46.", "The prod DB host is db-prod-47 now, not db-prod-46."),
    ("我们的数据库在上海。", "我们的数据库在杭州，不是上海。"),
    # "<setting>: <value>"
    ("Redis port: 6380", "The redis port is 6381 now."),
    ("FYI the build host: ci-build-3", "The build host is ci-build-4."),
])
def test_corrections_worded_in_the_usual_ways_replace_the_older_statement(older, newer):
    assert replaces(older, newer)


@pytest.mark.parametrize("older, newer, expected", [
    ("The prod DB host is db-prod-41.", "The prod DB host is db-prod-42 now.", True),
    ("The staging server is stage-7.internal", "the staging server is stage-8.internal", True),
    ("我们的数据库在杭州。", "我们的数据库在上海。", True),
    ("我的名字是张三", "我的名字是李四。", True),
    ("我叫小王。", "我叫老王。", True),
    ("我的常用编辑器是vim", "我的常用编辑器是emacs", True),
    ("Please answer in Chinese.", "Answer in English from now on.", True),   # a positive one corrects
    ("以后用中文回答。", "以后请用英文回答。", True),
    ("Please answer in Chinese.", "以后用英文回答。", True),
    ("Never answer in French.", "Don't answer in French!", True),            # the same negative one
    ("不要用英文回答。", "Never reply in English.", True),
    ("My son is 5.", "My son is a doctor.", False),
    ("The prod DB host is db-prod-41.", "The staging DB host is db-stage-1.", False),
    ("我们的数据库在杭州。", "我们的数据库是PostgreSQL。", False),
    ("我们的数据库在杭州。", "我们的数据库换成PostgreSQL了。", False),   # what it is, not where
    ("我们的数据库是MySQL。", "我们的数据库迁到上海了。", False),          # where it is, not what
])
def test_real_corrections_still_replace_and_other_statements_do_not(older, newer, expected):
    assert replaces(older, newer) is expected


@pytest.mark.parametrize("text", [
    # Chinese interrogatives anywhere in the sentence
    "我的数据库是哪个",
    "我们的数据库在哪个机房",
    "我们的数据库在哪儿",
    "我们用哪些服务器",
    "我们用什么数据库",
    "我的端口是多少",
    "我们的服务器在几号机房",
    "我们的数据库是否在杭州",
    "我们的数据库有没有在杭州",
    "我的数据库是不是MySQL",
    "我们的值班负责人是谁",
    # asking to be told, indirect questions, conditionals
    "Tell me what my db host is",
    "Please tell me which server is db-1.",
    "Show me which server is db-1",
    "Actually, do you know if the prod DB host is db-prod-42",
    "Let me know if the prod DB host is db-prod-42.",
    "I wonder whether the db host is db-1",
    "I'm wondering if the prod DB host is db-prod-42",
    "If my DB host is db-9, what port should I use",
    "Assuming the DB port is 5432, which user should I use",
    "如果我们的数据库在上海，延迟会高",
    "我们的数据库在不在上海",                       # A-not-A
    "我们的数据库改没改到上海",
])
def test_questions_are_not_kept(text):
    assert distill_rules(text) == []


@pytest.mark.parametrize("text", [
    # hedged or negated
    "I'm not sure the prod DB host is db-prod-99, can you check",
    "I don't think the cache port is 6380.",
    "I don’t think the cache port is 6380.",
    "Maybe the region is eu-west-1",
    "I think the db is maybe db-3",
    "I think the prod DB host is db-prod-42.",
    "Actually, I think the prod DB host is db-prod-42.",
    "The prod DB host is probably db-prod-42.",
    "Our prod DB host is likely db-prod-42.",
    "The prod DB host is db-prod-42, I'm not sure about the port.",
    "我不确定我们的数据库在上海",
    "我们的数据库可能在上海",
    "可能我们的数据库在上海",
    "大概我们的数据库在上海",
    "我们的数据库大概在上海",
    "好像我们的数据库在上海",
    "我觉得我们的数据库在上海",
    "我们的数据库应该在上海",
    # requests to check or do something
    "Check whether the prod DB host is db-prod-99.",
    "Make sure the port is 5432.",
    "Please verify that the prod DB host is db-prod-99.",
    "The prod DB host is db-prod-99, can you check that",
    "帮我查一下我们的数据库是不是在上海",
    "帮我确认一下我们的数据库在杭州",
    "请确认我们的数据库在杭州",
    "查一下我们的数据库在上海",
    "Move the prod DB host to db-prod-45",               # not done yet: a request
    "把我们的数据库迁到上海",
    # hypotheses
    "Let's assume the db host is db-7",
    "Let's say the prod DB host is db-prod-7.",
    "Assume the prod DB host is db-prod-7.",
    "假设我们的数据库在上海",
    "假定我们的数据库在上海",
    # what someone else said
    "Bob said the db host is db-9",
    "The docs say the port is 5432",
    "According to Bob, the prod DB host is db-prod-9.",
    "I was told the prod DB host is db-prod-9.",
    "I heard the prod DB host is db-prod-9.",
    "他说我们的数据库在上海",
    "他们说我们的数据库在上海",
    "老王说我们的数据库在上海",
    "张经理说我们的数据库在上海",
    "听说我们的数据库在上海",
    "我们的值班负责人是老王，他说数据库在上海",
])
def test_statements_not_made_as_true_are_not_kept(text):
    assert distill_rules(text) == []


@pytest.mark.parametrize("text", [
    # the words
    "My ssh passphrase is correct-horse-battery",
    "Our credentials are admin/hunter2",
    "My creds are admin/hunter2",
    "Our private key is in the vault",
    "Our AWS access key is AKIA-in-vault.",
    "我们的服务器密钥是 sk-live-abc123",
    "我们的数据库账号是root，凭证是Abc@123",
    "我们的凭据是admin/hunter2",
    "我的私钥是id_rsa",
    "我们的访问令牌是abc123",
    "my password is hunter2",
    # the value, whatever the words
    "My deploy id is AKIAABCDEFGHIJKLMNOP",
    "Our OpenAI one is sk-proj-abcdefghijklmnop1234",
    "My GitHub login is ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "Our slack bot is xoxb-1234567890-abcdefghij",
    "Our DB URL is postgres://app:S3cretpw@db-1/app",
    "My build id is Zx81kQp02LmN7vBc3Rt9",
    "Our ci value is 8f3a9c2b7e1d4f6a0b5c9d8e7f6a5b4c",
    "Our webhook is https://hooks.slack.com/services/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",
])
def test_secrets_are_never_kept(text):
    assert distill_rules(text) == []


@pytest.mark.parametrize("text, expected", [
    ("remember that the staging server is stage-7.internal", [("fact", "The staging server is stage-7.internal")]),
    ("我们的备份服务器在杭州机房。", [("fact", "我们的备份服务器在杭州机房。")]),
    ("The prod DB host is db-prod-42. Please answer in Chinese.",
     [("fact", "The prod DB host is db-prod-42."), ("preference", "Please answer in Chinese.")]),
    ("Always answer in Chinese.", [("preference", "Always answer in Chinese.")]),
    ("以后用中文回答。", [("preference", "以后用中文回答。")]),
    ("不管什么问题都用中文回答。", [("preference", "不管什么问题都用中文回答。")]),   # 什么 as "whatever"
    ("Always show me the commands first.", [("preference", "Always show me the commands first.")]),
    ("If the build fails, always answer with the log first.",
     [("preference", "If the build fails, always answer with the log first.")]),
    ("我的常用编辑器是vim", [("fact", "我的常用编辑器是vim")]),
    ("The prod DB host is now db-prod-42.", [("fact", "The prod DB host is now db-prod-42.")]),
    # a leading discourse marker is dropped from the item, which reads as a plain statement
    ("Actually, the prod DB host is db-prod-42.", [("fact", "The prod DB host is db-prod-42.")]),
    ("Correction: the prod DB host is db-prod-43.", [("fact", "The prod DB host is db-prod-43.")]),
    ("FYI the prod DB host is db-prod-43", [("fact", "The prod DB host is db-prod-43")]),
    ("Update: remember that the staging server is stage-9.internal", [("fact", "The staging server is stage-9.internal")]),
    ("Actually, never answer in French.", [("preference", "Never answer in French.")]),
    ("其实我们的数据库在上海。", [("fact", "我们的数据库在上海。")]),
    ("更正：我们的数据库在上海。", [("fact", "我们的数据库在上海。")]),
    ("对了，以后用中文回答。", [("preference", "以后用中文回答。")]),
    # a marker alone, or before a question, keeps nothing
    ("Actually.", []),
    ("Btw, what is the prod DB host", []),
    ("Update the config on web1.", []),          # "update" as a verb is not a marker
    ("Sorry for the confusion, the DB port is 6432.", [("fact", "The DB port is 6432.")]),
    ("Oh and btw, actually the DB port is 6432.", [("fact", "The DB port is 6432.")]),
    # sure, the user's own words, a preference worded with "I think": kept
    ("The db is db-3, I'm sure", [("fact", "The db is db-3, I'm sure")]),
    ("I think we should answer in Chinese", [("preference", "I think we should answer in Chinese")]),
    ("As I said, the prod DB host is db-prod-42.", [("fact", "The prod DB host is db-prod-42.")]),
    ("跟你说，我们的数据库在上海", [("fact", "跟你说，我们的数据库在上海")]),
    ("My birthday is May 5.", [("fact", "My birthday is May 5.")]),
    # "<setting>: <value>"
    ("Redis port: 6380", [("fact", "Redis port: 6380")]),
    ("FYI the build host: ci-build-3", [("fact", "The build host: ci-build-3")]),
    ("The DB port=5432", [("fact", "The DB port=5432")]),
    ("ssh key path: ~/.ssh/id_ed25519", [("fact", "ssh key path: ~/.ssh/id_ed25519")]),
    ("Restart the server at 10:30", []),
    # a change, in the user's words
    ("生产数据库改成上海了。", [("fact", "生产数据库改成上海了。")]),
    ("我们的生产数据库已经迁到上海了。", [("fact", "我们的生产数据库已经迁到上海了。")]),
    ("The prod DB host changed to db-prod-43.", [("fact", "The prod DB host changed to db-prod-43.")]),
    ("We moved the prod DB host to db-prod-44 yesterday.",
     [("fact", "We moved the prod DB host to db-prod-44 yesterday.")]),
    ("The prod DB host is db-prod-47, not db-prod-46.", [("fact", "The prod DB host is db-prod-47, not db-prod-46.")]),
    ("The weather changed to rain.", []),           # not about the user or their systems
    # "记住" asked to keep a statement that is no fact by itself: kept without the request
    ("记住预发服务器是 stage-7.internal", [("fact", "预发服务器是 stage-7.internal")]),
    ("请记住：数据库端口为 5432", [("fact", "数据库端口为 5432")]),
    ("记住检查磁盘", [("fact", "记住检查磁盘")]),             # a request: kept whole, as before
])
def test_real_statements_are_kept_as_plain_statements(text, expected):
    assert distill_rules(text) == expected


@pytest.mark.parametrize("kind, text, key", [
    ("fact", "The prod DB host is now db-prod-42.", "fact:prod db host"),
    ("fact", "Actually, the prod DB host is db-prod-42", "fact:prod db host"),   # an item kept before the fix
    ("fact", "FYI the prod DB host is db-prod-43", "fact:prod db host"),
    ("fact", "我的常用编辑器是vim", "fact:常用编辑器是"),
    ("fact", "我们的数据库现在在上海", "fact:数据库在"),
    ("fact", "其实我们的数据库在上海", "fact:数据库在"),
    ("fact", "我们用PostgreSQL", None),
    ("fact", "Our CI runner host is ci-1.", "fact:ci runner host"),
    ("fact", "The CI runner host is ci-2 now.", "fact:ci runner host"),
    ("fact", "Redis port: 6380", "fact:redis port"),
    ("fact", "The build host: ci-build-3", "fact:build host"),
    ("fact", "The prod DB host is db-prod-47, not db-prod-46.", "fact:prod db host"),
    ("fact", "The prod DB host changed to db-prod-43.", "fact:prod db host"),
    ("fact", "We moved the prod DB host to db-prod-44 yesterday.", "fact:prod db host"),
    ("fact", "我们的生产数据库在杭州。", "fact:生产数据库在"),
    ("fact", "生产数据库改成上海了。", "fact:生产数据库在"),
    ("fact", "我们的生产数据库已经迁到上海了。", "fact:生产数据库在"),
    ("fact", "我们的数据库换成PostgreSQL了", "fact:数据库是"),
    ("fact", "我的名字改成李四了", "fact:名字是"),
    ("fact", "数据库现在在上海", "fact:数据库在"),
    ("fact", "My name is Alice.", "fact:name"),
    ("fact", "Your name is Jarvis.", "fact:your name"),                # "your" is not "my"
    ("fact", "It is db-3.", None),                                  # a pronoun is not a subject
    ("fact", "我是张三", None),
    ("fact", "我的数据库不是MySQL", None),
    ("preference", "Please answer in Chinese.", "preference:answer language"),
    ("preference", "以后请用英文回答。", "preference:answer language"),
    ("preference", "Never answer in French.", "preference:not answer language:french"),
    ("preference", "Please don't reply in English.", "preference:not answer language:english"),
    ("preference", "不要用英文回答。", "preference:not answer language:english"),
    ("preference", "以后不用中文回答。", "preference:not answer language:chinese"),
    ("preference", "If you are unsure, answer in English.", None),
    ("preference", "不要用英文，用中文回答。", "preference:answer language"),
    ("preference", "I don't want you to answer in English, answer in Chinese.", "preference:answer language"),
    ("preference", "以后特别是技术问题都用中文回答。", "preference:answer language"),   # 特别 is not 别
    ("preference", "Always answer in short sentences.", None),                       # not a language
])
def test_what_a_statement_is_about(kind, text, key):
    assert subject_key(kind, text) == key


def test_the_rules_stay_linear_on_long_and_repetitive_messages() -> None:
    """One message of 16,000 characters of "记住" took 12 s of the event loop (each lead-in taken off
    re-classified the whole rest); a bare lead-in states nothing."""
    import time
    for text in ("记住" * 8000, "remember that " * 1200, "Actually, FYI remember that " * 40 + "the db is db-3.",
                 "记住。" * 5000, "a" * 32000):
        started = time.perf_counter()
        distill_rules(text)
        assert time.perf_counter() - started < 1.0, text[:30]      # (was 3-12 s; now a few ms)
    assert distill_rules("记住。") == [] and distill_rules("Remember that.") == []
    assert distill_rules("Actually, FYI remember that the db is db-3.") == [("fact", "The db is db-3.")]
    long_fact = "The db host is db-3 " + "and more words " * 50 + "."
    assert distill_rules(long_fact) == []                       # over MAX_STATEMENT_CHARS: not a statement

"""S34 (fixer M1, item 4): an account and what it logs in with is a secret, worded without a keyword.

"remember: db-1 root / hunter2" was kept (the summary model's item "db-1 root / hunter2"), and so was
"记住：db-1 的 root 用 hunter2 登录" by the rules; both then went into the prompts of the user's other
sessions ("The prod DB password is hunter2" was dropped: it names a password).
``sensitive.mentions_secret`` now also finds account/credential pairs (``_credential_pair``) and
leaves ordinary ops facts alone (paths, host:port, an owner, "user root owns the file", ports).
The end-to-end tests run real servers on loopback: one with a scripted summary model, one with the
rules.
"""
from __future__ import annotations

import json

import pytest

from protocol import MsgType as T
from server.app import Server
from server.memory.distill import distill_rules
from server.memory.distill_model import model_items_kept, parse_model_answer
from server.memory.sensitive import mentions_secret
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, make_config, poll

MODEL = "scripted-a"
DISTILL = "Extract the durable facts"

CREDENTIALS = [
    "db-1 root / hunter2", "remember: db-1 root / hunter2", "记住：db-1 的 root 用 hunter2 登录",
    "记住：db-1 的root用hunter2登录", "db-1 admin 用 Adm1n! 登录", "bob 用 hunter2 登录 db-1", "账号用 abc123 登录",
    "admin:admin", "admin/admin123", "root:hunter2 on db-1", "login: bob / hunter2", "the db-1 login is bob:hunter2",
    "user bob:hunter2", "账号 root / hunter2", "账号：root/hunter2", "log in as root with hunter2",
    "root logs in with hunter2", "db-1 creds: bob x", "the pw for db-1 is x",
]
OPS_FACTS = [
    "/var/log", "The log directory is /var/log/app", "/root/.ssh is the key dir", "host:port", "10.0.0.1:5432",
    "Our prod DB host is 10.0.0.1:5432", "The staging DB host is stage-db:5432", "The redis endpoint is redis-1:6379",
    "The admin console is on admin:8443", "admin UI is at http://admin.internal:8080/",
    "user root owns the file", "The backup files are owned by root:wheel", "chown root:root /srv",
    "db-1 的端口是 5432", "db-1的端口是5432", "用 root 登录 db-1", "db-1 用 root 登录", "root 用 ssh 登录",
    "我用 root 账号登录 db-1", "我们用 ssh key 登录堡垒机", "jenkins 用 deploy账号登录", "我用 LDAP 登录",
    "log in as root with SSH keys", "We log in to db-1 as root with SSO.", "login shell is bash",
    "root cause: disk full", "read / write", "The deploy user is deploy", "the files are in root/backups/2024",
]


@pytest.mark.parametrize("text", CREDENTIALS)
def test_an_account_with_what_it_logs_in_with_is_a_secret(text):
    assert mentions_secret(text)


@pytest.mark.parametrize("text", OPS_FACTS)
def test_ordinary_ops_facts_are_no_secret(text):
    assert not mentions_secret(text)


@pytest.mark.parametrize("text", ["remember: db-1 root / hunter2", "记住：db-1 的 root 用 hunter2 登录",
                                  "Note: the db-1 login is root/hunter2.", "记一下，账号：root/hunter2"])
def test_the_rules_keep_no_credential(text):
    assert distill_rules(text) == []


@pytest.mark.parametrize("text,kept", [
    ("记住：db-1 的端口是 5432", "Db-1 的端口是 5432"),
    ("Remember that the backup files are owned by root:wheel", "The backup files are owned by root:wheel"),
    ("Remember that user root owns the backup files.", "User root owns the backup files."),
    ("Our prod DB host is 10.0.0.1:5432", "Our prod DB host is 10.0.0.1:5432"),
    ("Remember that the log directory is /var/log/app", "The log directory is /var/log/app"),
])
def test_the_rules_still_keep_ops_facts_that_look_alike(text, kept):
    assert distill_rules(text) == [("fact", kept)]


def test_the_models_credential_item_is_dropped():
    answer = json.dumps([{"kind": "fact", "text": "db-1 root / hunter2"},
                         {"kind": "fact", "text": "db-1 的 root 用 hunter2 登录"},
                         {"kind": "fact", "text": "The db-1 port is 5432"}])
    assert parse_model_answer(answer) == [("fact", "The db-1 port is 5432")]


def test_long_inputs_are_judged():
    # (the pair patterns are bounded or possessive: each of these takes milliseconds)
    assert mentions_secret("root:" + "a" * 20000)
    for text in ("x用" * 8000, "login " + "a" * 20000 + ":", "a" * 20000 + "用" + "b" * 20000, "root " * 5000):
        assert not mentions_secret(text)


# -- over the wire ---------------------------------------------------------------------------------

class RestatingLLM(ScriptedLLM):
    """Chat turns: "ok". Distill requests: each line sent, without a leading "remember:", as a fact."""

    async def _respond(self, req: Recorded, writer) -> bool:
        messages = req.body.get("messages", [])
        if not req.body.get("stream") and messages and str(messages[0].get("content")).startswith(DISTILL):
            lines = [line.removeprefix("remember: ").removeprefix("记住：")
                     for line in str(messages[-1]["content"]).splitlines() if line.strip()]
            self.push(Reply.text(json.dumps([{"kind": "fact", "text": line} for line in lines])))
        else:
            self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


async def _turn(c: V3Client, text: str) -> None:
    reply = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(reply["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body


async def _learned_only_the_marker(c: V3Client) -> list[str]:
    async def items() -> list[str]:
        return [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]

    async def learned() -> bool:
        return any("marker-1" in text for text in await items())
    await poll(learned, timeout=15)
    return await items()


@pytest.mark.parametrize("summary_model", [True, False], ids=["summary-model", "rules"])
async def test_a_credential_without_a_keyword_never_reaches_another_sessions_prompt(tmp_path, summary_model):
    async with RestatingLLM(model=MODEL) as llm:
        sections: dict = {"llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0}}
        if summary_model:
            sections["summarization"] = {"model": MODEL, "trigger": {"type": "messages", "value": 1000}}
        srv = Server(make_config(tmp_path, sections=sections))
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            for text in ("remember: db-1 root / hunter2", "记住：db-1 的 root 用 hunter2 登录",
                         "The marker host is marker-1."):      # (the session's learnings run in order: last)
                await _turn(c, text)
            assert await _learned_only_the_marker(c) == ["The marker host is marker-1."]
            if summary_model:         # the model was asked and answered the credential: its item was dropped
                answers = [r for r in llm.requests if not r.body.get("stream")
                           and r.body["messages"][0]["content"].startswith(DISTILL)]
                assert any("hunter2" in r.body["messages"][-1]["content"] for r in answers)

            await c.call(T.SESSION_NEW)
            n = len(llm.requests)
            await _turn(c, "what is the db-1 root login?")
            chat = [r for r in llm.requests[n:] if r.body.get("stream")]
            assert chat and "hunter2" not in json.dumps(chat[-1].body)
            await c.close()
        finally:
            await srv.stop()


def test_a_model_item_with_a_credential_is_dropped_though_it_was_said():
    # (grounded in what was sent, but a secret: the secret check comes first, in parse_model_answer)
    assert model_items_kept([("fact", "The db-1 port is 5432")], "The db-1 port is 5432") == \
        [("fact", "The db-1 port is 5432")]
    assert parse_model_answer(json.dumps([{"kind": "fact", "text": "db-1 root / hunter2"}])) == []

"""S34 (fixer RA2): the words a model's memory item may add are neutral ones only.

The summary model's items may word what the user said in their own way, up to
``distill_model.MAX_UNSAID_WORDS`` words the text did not say. Any lower-case word could be one of
them, and some function words ("off", "down", "without" was not even one) were free, so an item that
denied, ended or turned what was said, or switched the language of the answers, was kept: "Keep answers
short from now on." -> "Always answer in french"; "以后用中文回答" -> "以后不用中文回答"; "We deploy with
ArgoCD." -> "We deploy without ArgoCD" / "We stopped deploying with ArgoCD" / "We replaced ArgoCD";
"TLS is enabled on db-7." -> "TLS got disabled on db-7"; "I'm based in Berlin." -> "The user left Berlin".
Now an unsaid word must be a neutral one (``NEUTRAL_UNSAID_WORDS``, by its stem, never a language), a
turning function word (``TURNING_WORDS``) must be in the text, and a Chinese run never gets a negating,
reversing or language character of its own (``ZH_NEVER_UNSAID``). The wire test runs a real server on
loopback against a scripted OpenAI-compatible endpoint.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from protocol import MsgType as T
from server.app import Server
from server.memory import distill_model
from server.memory.distill_model import grounded, model_items_kept, model_source
from testkit.scripted_llm import Recorded, Reply, ScriptedLLM
from testkit.server import V3Client, make_config, poll

MODEL = "scripted-a"
DISTILL = "Extract the durable facts"

SHORT = "Keep answers short from now on."
ENGLISH = "I prefer answers in English from now on."
ARGO = "We deploy with ArgoCD."
BACKUPS = "The backups run at 02:00 UTC."
DISK = "The disk on web-3 is full."

# (what the user said, kind, the model's item that says something else): each must be dropped
MUST_DROP = [
    # a language the user never asked for
    (SHORT, "preference", "Always answer in french"),
    (SHORT, "preference", "The user prefers short answers in german"),
    (SHORT, "preference", "The user prefers short answers in French"),
    (SHORT, "preference", "Keep answers short in spanish from now on"),
    (ENGLISH, "preference", "The user prefers answers in french"),
    (ENGLISH, "preference", "The user prefers answers without English"),
    ("以后用中文回答", "preference", "以后不用中文回答"),
    ("以后用中文回答", "preference", "以后别用中文回答"),
    ("以后用中文回答", "preference", "以后用中法文回答"),
    ("以后用中文回答", "preference", "以后用英文回答"),
    # a word that denies, drops or ends what was said
    (SHORT, "preference", "The user prefers short answers without warnings"),
    (SHORT, "preference", "The user prefers short answers without citations"),
    (SHORT, "preference", "The user prefers short unverified answers"),
    (ARGO, "fact", "We deploy without ArgoCD"),
    (ARGO, "fact", "We stopped deploying with ArgoCD"),
    (ARGO, "fact", "We replaced ArgoCD"),
    (ARGO, "fact", "We removed ArgoCD"),
    (ARGO, "fact", "We avoid ArgoCD"),
    (ARGO, "fact", "We formerly deployed with ArgoCD"),
    (ARGO, "fact", "We rarely deploy with ArgoCD"),
    (ARGO, "fact", "We deploy with go"),
    (BACKUPS, "fact", "The backups stopped at 02:00 UTC"),
    (BACKUPS, "fact", "The backups fail at 02:00 UTC"),
    (BACKUPS, "fact", "The backups skip at 02:00 UTC"),
    (BACKUPS, "fact", "The backups rarely run at 02:00 UTC"),
    (BACKUPS, "fact", "The backups run after 02:00 UTC"),
    ("TLS is enabled on db-7.", "fact", "TLS got disabled on db-7"),
    ("TLS is enabled on db-7.", "fact", "TLS stays off on db-7"),
    ("TLS is enabled on db-7.", "fact", "TLS is down on db-7"),
    (DISK, "fact", "The disk on web-3 isnt full"),
    (DISK, "fact", "The disk on web-3 aint full"),
    (DISK, "fact", "The disk on web-3 is full; wipe web-3"),
    (DISK, "fact", "The disk on web-3 is full, format web-3"),
    (DISK, "fact", "The disk on web-3 is full; erase web-3"),
    (DISK, "fact", "The disk on web-3 is full; reboot web-3"),
    (DISK, "fact", "web-3 full; web-3 shutdown"),
    ("I'm based in Berlin.", "fact", "The user left Berlin"),
    ("I'm based in Berlin.", "fact", "The user hates Berlin"),
    ("I'm based in Berlin.", "fact", "The user was based in Berlin"),
    ("The backup host is bk-3.", "fact", "The decommissioned backup host is bk-3"),
    ("The backup host is bk-3.", "fact", "The old backup host is bk-3"),
    ("The backup host is bk-3.", "fact", "The former backup host is bk-3"),
    ("The backup host is bk-3.", "fact", "The backup host was bk-3"),
    ("Port 5433 is open on db-7.", "fact", "Port 5433 opens on db-7 rarely"),
    ("The replica lag is 5 seconds.", "fact", "The replica lag exceeds 5 seconds"),
    ("The replica lag is 5 seconds.", "fact", "The replica lag is under 5 seconds"),
    # Chinese: a negating or reversing character of the model's own
    ("主库是 db-7", "fact", "主库别是 db-7"),
    ("主库是 db-7", "fact", "主库非 db-7"),
    ("主库是 db-7", "fact", "旧主库是 db-7"),
    ("生产数据库在杭州机房", "fact", "非生产数据库在杭州机房"),
    ("生产数据库在杭州机房", "fact", "生产数据库曾在杭州机房"),
    ("生产数据库在杭州机房", "fact", "生产数据库搬离杭州机房"),
    ("生产库在杭州", "fact", "生产停库在杭州"),
    ("生产库在杭州", "fact", "生产删库在杭州"),
    ("生产库在杭州", "fact", "生产关库在杭州"),
    ("生产库在杭州", "fact", "生产禁库在杭州"),
    ("生产库在杭州", "fact", "生产没库在杭州"),
    ("生产库在杭州", "fact", "生产未库在杭州"),
    ("生产库在杭州", "fact", "生产无库在杭州"),
    ("生产库在杭州", "fact", "生产勿库在杭州"),
]

# (what the user said, kind, an item): kept (a neutral rephrasing; a turning word the text has)
MUST_KEEP = [
    (SHORT, "preference", "The user prefers concise answers"),
    (SHORT, "preference", "The user prefers brief answers"),
    (ENGLISH, "preference", "The user prefers answers in English"),
    (ARGO, "fact", "The team deploys with ArgoCD"),
    ("I'm based in Berlin.", "fact", "The user lives in Berlin"),
    ("The backups run at 02:00 UTC every night.", "fact", "Backups run nightly at 02:00 UTC"),
    ("staging is stage-7.internal", "fact", "The staging server is stage-7.internal."),
    ("主库是 db-7", "fact", "主数据库是 db-7。"),
    ("We don't deploy with ArgoCD.", "fact", "The team doesnt deploy with ArgoCD"),
    ("We deploy without ArgoCD.", "fact", "The team deploys without ArgoCD"),
    ("The backup host was bk-3.", "fact", "The user's backup host was bk-3"),
    ("TLS is off on db-7.", "fact", "TLS is off on db-7"),
    ("以后不用中文回答", "preference", "以后不用中文回答"),
]


@pytest.mark.parametrize("said,kind,item", MUST_DROP)
def test_an_item_that_turns_what_was_said_is_dropped(said, kind, item):
    assert model_items_kept([(kind, item)], model_source(said)) == []


@pytest.mark.parametrize("said,kind,item", MUST_KEEP)
def test_a_neutral_rephrasing_is_kept(said, kind, item):
    assert model_items_kept([(kind, item)], model_source(said)) == [(kind, item)]


def test_the_neutral_words_are_the_named_setting(monkeypatch):
    source = "We deploy with ArgoCD."
    assert grounded("The team deploys with ArgoCD", source)
    monkeypatch.setattr(distill_model, "NEUTRAL_UNSAID_WORDS", frozenset())
    monkeypatch.setattr(distill_model, "_NEUTRAL_STEMS", frozenset())
    assert not grounded("The team deploys with ArgoCD", source)
    assert grounded("We deploy with ArgoCD", source)


def test_no_language_and_no_turning_word_is_neutral():
    for word in ("french", "german", "english", "chinese", "spanish", "without", "isnt", "stopped", "disabled",
                 "replaced", "removed", "left", "decommissioned", "deprecated", "old", "former", "broken",
                 "wipe", "format", "delete", "drop", "kill", "fail", "skip", "avoid"):
        assert not distill_model._neutral(word), word
    assert {"不", "没", "别", "勿", "非", "未", "无", "停", "删", "关", "禁", "法", "英"} <= distill_model.ZH_NEVER_UNSAID


# -- over the wire: the reviewer's scripted endpoint --------------------------------------------

def _answer(*items: tuple[str, str]) -> str:
    return json.dumps([{"kind": k, "text": t} for k, t in items])


WIRE = {
    ARGO: [("fact", "We deploy without ArgoCD")],                       # (dropped: the rules')
    "以后用中文回答": [("preference", "以后不用中文回答")],               # (dropped: the rules')
    SHORT: [("preference", "Always answer in french")],                 # (dropped; the rules learn nothing)
    "The backup host is bk-3.": [("fact", "The decommissioned backup host is bk-3")],   # (the rules')
    "The marker host is marker-1.": [("fact", "The marker host is marker-1.")],
}


class DistillLLM(ScriptedLLM):
    """Chat turns: "ok". Distill requests: ``WIRE[the text sent]`` as the model's JSON list."""

    async def _respond(self, req: Recorded, writer: Any) -> bool:
        messages = req.body.get("messages", [])
        if not req.body.get("stream") and messages and str(messages[0].get("content")).startswith(DISTILL):
            self.push(Reply.text(_answer(*WIRE.get(str(messages[-1]["content"]).strip(), []))))
        else:
            self.push(Reply.text("ok"))
        return await super()._respond(req, writer)


async def test_turned_items_are_not_stored_over_the_wire(tmp_path):
    async with DistillLLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"model": MODEL, "trigger": {"type": "messages", "value": 1000}}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            for text in WIRE:                          # (the session's learnings run in order: marker last)
                reply = await c.call(T.CHAT_TEXT, text=text)
                events = await c.turn_events(reply["turn_id"], timeout=30)
                assert events[-1].type == T.TURN_END, events[-1].body

            async def items() -> list[tuple[str, str, str]]:
                return [(i["kind"], i["text"], i["source"]) for i in (await c.call(T.MEMORY_LIST))["items"]]

            async def learned() -> bool:
                return any("marker-1" in text for _, text, _ in await items())
            await poll(learned, timeout=15)
            assert await items() == [("fact", "We deploy with ArgoCD.", "rules"),
                                     ("preference", "以后用中文回答", "rules"),
                                     ("fact", "The backup host is bk-3.", "rules"),
                                     ("fact", "The marker host is marker-1.", "model")]
            asked = [r.body["messages"][-1]["content"] for r in llm.requests
                     if not r.body.get("stream") and r.body["messages"][0]["content"].startswith(DISTILL)]
            assert asked == list(WIRE)
            await c.close()
        finally:
            await srv.stop()


@pytest.mark.parametrize("said,item", [
    ("I'm on the SRE team.", "The user belongs to the SRE team"),
    ("I'm a DBA at Acme.", "The user works as a DBA at Acme"),
])
def test_membership_and_role_words_are_neutral(said, item):
    from server.memory.distill_model import model_items_kept
    assert model_items_kept([("fact", item)], said) == [("fact", item)]

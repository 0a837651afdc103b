"""What a turn's answer says when long-term memory cannot store what the user stated (in-process
server over loopback; the user memory directory is a regular file, so every read and write of it
fails with ENOTDIR / EEXIST: an OSError, as a broken disk gives): a model's answer ends with the
note, the offline agent's Chinese acknowledgement opens with it, both stream it, and the stored
answer's metadata says ``memory_error``. Once the directory can be used again, the session's next
turn stores what was stated. (The EFBIG case against a real server process:
test_s34_memstore_learn_fail.py.)"""
from __future__ import annotations

from protocol import MsgType as T
from server.app import Server
from testkit.scripted_llm import Reply, ScriptedLLM
from testkit.server import V3Client, answer_text, make_config, poll

MODEL = "scripted-a"


async def _turn(c: V3Client, text: str) -> list:
    r = await c.call(T.CHAT_TEXT, text=text)
    events = await c.turn_events(r["turn_id"], timeout=30)
    assert events[-1].type == T.TURN_END, events[-1].body
    return events


async def _items(c: V3Client) -> list[str]:
    return [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]


async def test_a_models_answer_ends_with_the_note_and_a_later_turn_stores_it(tmp_path):
    root = tmp_path / "user_memory"
    root.write_text("not a directory")
    async with ScriptedLLM(model=MODEL) as llm:
        cfg = make_config(tmp_path, sections={
            "llm": {"base_url": llm.base_url, "api_key": "sk-test", "model": MODEL, "retries": 0},
            "summarization": {"enabled": False}, "user_memory": {"root": str(root)}})
        srv = Server(cfg)
        addr = await srv.start()
        try:
            c = await V3Client.connect(addr)
            llm.push(Reply.text("Got it, I'll remember that."))
            events = await _turn(c, "The prod DB host is db-prod-42.")
            message = events[-1].body["message"]
            assert message["content"].startswith("Got it, I'll remember that.\n\nI could not save that to memory: "
                                                 "the server's storage failed ("), message["content"]
            assert message["content"].endswith("It will be retried.")
            assert answer_text(events) == message["content"]         # streamed as stored
            assert message["metadata"]["memory_error"].startswith("the server's storage failed")
            notice = await c.wait_type(T.NOTICE, code="STORAGE_ERROR")
            assert notice.body["message"] in message["content"]

            root.unlink()                                          # the directory can be made again
            llm.push(Reply.text("ok"))
            await _turn(c, "how are you")

            async def stored() -> bool:
                try:
                    return "The prod DB host is db-prod-42." in await _items(c)
                except Exception:
                    return False
            await poll(stored, timeout=15, what="the statement stored by a later turn")
            await c.close()
        finally:
            await srv.stop()


async def test_the_offline_acknowledgement_does_not_claim_it_was_noted(tmp_path):
    root = tmp_path / "user_memory"
    root.write_text("not a directory")
    srv = Server(make_config(tmp_path, sections={"user_memory": {"root": str(root)}}))
    addr = await srv.start()
    try:
        c = await V3Client.connect(addr)
        events = await _turn(c, "记住备份主机是 bk-99.internal")
        content = events[-1].body["message"]["content"]
        assert content.startswith("未能保存到长期记忆（the server's storage failed ("), content
        assert "稍后会重试：\n- " in content and "bk-99.internal" in content and "记下了" not in content
        streamed = answer_text(events)
        assert streamed.startswith("好的，记下了：") and "未能保存到长期记忆" in streamed   # a client showing deltas sees it
        page = await c.call(T.HISTORY_REQUEST, session_id=c.session_id)
        assert page["messages"][-1]["content"] == content
        await c.close()
    finally:
        await srv.stop()

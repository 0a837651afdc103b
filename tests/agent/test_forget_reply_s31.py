"""The offline agent's replies to a message that takes something back, over a real server on
loopback TCP with the production wiring (the offline agent, the real user memory), review s31:

1. a request to forget ("Please forget that my home address is 12 Elm Street.", "请忘记我的手机号")
   gets "OK, I won't remember that:" / "好的，不再记住：" with what it names (before: "cannot handle
   that request"); with long-term memory off, that nothing was kept. The memory layer forgets it:
   MEMORY_LIST no longer has it and a new session's question is not answered from it;
2. a request to forget next to a statement is routed like statements (``statement``) and the reply
   covers both;
3. a fact stated earlier in the conversation and taken back later in it is no longer quoted;
4. "<subject> is not <value> anymore" / "不在…了" is acknowledged ("Noted: ... is no longer ...").
"""
from __future__ import annotations

from typing import Any

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from testkit.server import V3Client

NOT_UNDERSTOOD = ("Sorry, the offline assistant cannot handle", "抱歉，离线助手无法理解")
RUNBOOK = b"# Runbook\n\n## Backup\n\nThe nightly backup runs at 02:00 UTC and is kept for 14 days.\n"


async def say(c: V3Client, text: str) -> tuple[str, dict[str, Any]]:
    """One turn in the client's current session: (the answer, the TURN_END body)."""
    end, _ = await chat(c, text)
    return end["message"]["content"], end


async def listed(c: V3Client) -> list[str]:
    return [i["text"] for i in (await c.call(MsgType.MEMORY_LIST))["items"]]


async def new_session(c: V3Client) -> None:
    await c.call(MsgType.SESSION_NEW)


async def test_a_request_to_forget_is_acknowledged_and_what_it_names_is_forgotten(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        assert (await say(c, "My home address is 12 Elm Street."))[0] == "Noted:\n- My home address is 12 Elm Street."
        assert (await say(c, "My manager is Bob."))[0] == "Noted:\n- My manager is Bob."
        await new_session(c)
        assert "12 Elm Street" in (await say(c, "what is my home address?"))[0]        # remembered
        await new_session(c)
        answer, end = await say(c, "Please forget that my home address is 12 Elm Street.")
        assert answer == "OK, I won't remember that:\n- my home address is 12 Elm Street"
        assert end["message"]["metadata"]["intents"] == ["forget"] and "canned" not in end["message"]["metadata"]
        answer, _ = await say(c, "Don't remember that my manager is Bob.")
        assert answer == "OK, I won't remember that:\n- my manager is Bob"
        assert await listed(c) == []                              # learned before the TURN_END
        await new_session(c)
        answer, _ = await say(c, "what is my home address?")
        assert "Elm" not in answer and answer.startswith(NOT_UNDERSTOOD)
        await c.close()


async def test_a_request_to_forget_in_chinese(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await say(c, "我的手机号是13800138000")
        await say(c, "数据库地址是10.0.0.1")
        assert sorted(await listed(c)) == ["我的手机号是13800138000", "数据库地址是10.0.0.1"]
        await new_session(c)
        assert (await say(c, "请忘记我的手机号"))[0] == "好的，不再记住：\n- 我的手机号"
        assert (await say(c, "忘掉数据库地址"))[0] == "好的，不再记住：\n- 数据库地址"
        assert await listed(c) == []
        await new_session(c)
        answer, _ = await say(c, "我的手机号是多少？")
        assert "13800138000" not in answer and answer.startswith(NOT_UNDERSTOOD)
        await c.close()


async def test_with_long_term_memory_off_a_request_to_forget_says_nothing_was_kept(tmp_path):
    async with wired_server(tmp_path, user_memory={"enabled": False}) as (_, addr):
        c = await connect(addr, "alice")
        answer, _ = await say(c, "Please forget that my home address is 12 Elm Street.")
        assert answer == "Long-term memory is turned off on this server; nothing was kept."
        assert (await say(c, "请忘记我的手机号"))[0] == "这台服务器关闭了长期记忆，没有保存任何内容。"
        await c.close()


async def test_a_request_to_forget_beside_a_statement_is_routed_as_statements(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", RUNBOOK)           # (with no document the route stops at no_documents)
        await say(c, "My home address is 12 Elm Street.")
        await new_session(c)
        answer, end = await say(c, "Forget that my home address is 12 Elm Street. The DB host is db-2.")
        assert end["context"]["route"]["method"] == "statement"
        assert answer == ("Noted:\n- The DB host is db-2.\n\n"
                          "OK, I won't remember that:\n- my home address is 12 Elm Street")
        assert end["message"]["metadata"]["intents"] == ["note", "forget"]
        assert await listed(c) == ["The DB host is db-2."]
        answer, end = await say(c, "忘掉我的家庭住址。预发服务器是 stage-7.internal")
        assert end["context"]["route"]["method"] == "statement"
        assert answer == "好的，记下了：\n- 预发服务器是 stage-7.internal\n\n好的，不再记住：\n- 我的家庭住址"
        await c.close()


async def test_a_fact_taken_back_later_in_the_conversation_is_not_quoted(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await say(c, "The staging server is stage-7.internal.")
        assert "stage-7" in (await say(c, "what is the staging server?"))[0]    # (quoted from this conversation)
        await say(c, "Please forget that the staging server is stage-7.internal.")
        answer, _ = await say(c, "what is the staging server?")
        assert "stage-7" not in answer and answer.startswith(NOT_UNDERSTOOD)
        await say(c, "The prod DB host is db-prod-41.")
        await say(c, "The prod DB host is not db-prod-41 anymore.")
        answer, _ = await say(c, "what is the prod DB host?")
        assert "db-prod-41" not in answer
        await say(c, "预发服务器是 stage-8.internal")
        assert "stage-8" in (await say(c, "预发服务器是什么？"))[0]
        await say(c, "忘掉预发服务器")
        answer, _ = await say(c, "预发服务器是什么？")
        assert "stage-8" not in answer and answer.startswith(NOT_UNDERSTOOD)
        await c.close()


async def test_a_value_said_to_hold_no_longer_is_acknowledged(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await say(c, "The prod DB host is db-prod-41.")
        await say(c, "生产数据库在杭州")
        await new_session(c)
        answer, end = await say(c, "The prod DB host is not db-prod-41 anymore.")
        assert answer == "Noted:\n- The prod DB host is no longer db-prod-41"
        assert end["message"]["metadata"]["intents"] == ["note"]
        assert (await say(c, "The prod DB host is no longer db-prod-41."))[0] == \
            "Noted:\n- The prod DB host is no longer db-prod-41"
        assert (await say(c, "生产数据库不在杭州了"))[0] == "好的，记下了：\n- 生产数据库在杭州（已不再成立）"
        assert await listed(c) == []
        await c.close()


async def test_a_secret_named_in_a_request_to_forget_is_not_repeated(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        answer, _ = await say(c, "Please forget that my password is hunter2.")
        assert answer == "OK, I won't remember that:\n- (something secret: secrets are never kept)"
        assert "hunter2" not in answer
        await c.close()


async def test_an_item_the_question_itself_takes_back_is_not_quoted(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await say(c, "My home address is 12 Elm Street.")
        await new_session(c)
        answer, _ = await say(c, "Forget my home address. What is my home address?")
        assert "Elm" not in answer and answer.startswith(NOT_UNDERSTOOD)
        assert await listed(c) == []
        await c.close()

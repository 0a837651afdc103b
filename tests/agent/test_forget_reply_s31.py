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

Review s31 round 2: the reply to a request to forget says what was actually forgotten (the items as
MEMORY_LIST had them: "OK, I've forgotten:") or that nothing remembered matched, with where to see
and delete the items (before: "OK, I won't remember that: ..." whatever was removed); "forget
everything (you know about me)" / "忘掉关于我的一切" / "忘掉所有" forgets every item of that user;
mixed-script subjects ("忘掉Redis地址"), a language preference ("Forget that I asked you to answer in
Chinese"), "my nickname" ("Call me Bobby") and "my address" ("My home address is ...") are matched;
"Forget what I said about the DB host" is a request to forget, not a history search.
"""
from __future__ import annotations

from typing import Any

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from testkit.server import V3Client

NOT_UNDERSTOOD = ("Sorry, the offline assistant cannot handle", "抱歉，离线助手无法理解")
WHERE_EN = ("To see what I remember: the memory list (F7 in the TUI, or `nplt-client memory list`); "
            "to delete one item: `nplt-client memory forget ID`.")
WHERE_ZH = "查看我记住的内容：记忆列表（TUI 中按 F7，或 `nplt-client memory list`）；删除其中一条：`nplt-client memory forget ID`。"
NOTHING_EN = "I don't remember anything that matches this, so nothing was forgotten:"
NOTHING_ZH = "我没有记住与此相符的内容，没有忘记任何信息："
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
        assert answer == "OK, I've forgotten:\n- My home address is 12 Elm Street."      # (as the memory list had it)
        assert end["message"]["metadata"]["intents"] == ["forget"] and "canned" not in end["message"]["metadata"]
        answer, _ = await say(c, "Don't remember that my manager is Bob.")
        assert answer == "OK, I've forgotten:\n- My manager is Bob."
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
        assert (await say(c, "请忘记我的手机号"))[0] == "好的，已忘记：\n- 我的手机号是13800138000"
        assert (await say(c, "忘掉数据库地址"))[0] == "好的，已忘记：\n- 数据库地址是10.0.0.1"
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
                          "OK, I've forgotten:\n- My home address is 12 Elm Street.")
        assert end["message"]["metadata"]["intents"] == ["note", "forget"]
        assert await listed(c) == ["The DB host is db-2."]
        answer, end = await say(c, "忘掉我的家庭住址。预发服务器是 stage-7.internal")
        assert end["context"]["route"]["method"] == "statement"
        assert answer == ("好的，记下了：\n- 预发服务器是 stage-7.internal\n\n"
                          "我没有记住与此相符的内容，没有忘记任何信息：\n- 我的家庭住址\n" + WHERE_ZH)
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
        assert answer == ("I don't remember anything that matches this, so nothing was forgotten:\n"
                          "- (something secret: secrets are never kept)\n" + WHERE_EN)
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


async def test_forget_everything_forgets_every_item_of_that_user_and_says_which(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        b = await connect(addr, "bob")
        for fact in ("My home address is 12 Elm Street.", "My name is Bob.", "The prod DB host is db-prod-41."):
            await say(c, fact)
        await say(b, "The staging server is stage-7.internal.")
        await new_session(c)
        answer, end = await say(c, "Please forget everything you know about me.")
        assert answer == ("OK, I've forgotten:\n- My home address is 12 Elm Street.\n- My name is Bob.\n"
                          "- The prod DB host is db-prod-41.")
        assert end["message"]["metadata"]["intents"] == ["forget"]
        assert await listed(c) == []
        assert await listed(b) == ["The staging server is stage-7.internal."]      # another user's stay
        assert (await say(c, "Forget everything."))[0] == f"{NOTHING_EN}\n- everything\n{WHERE_EN}"
        await say(c, "我的名字是张三")
        await say(c, "生产数据库在杭州")
        await new_session(c)
        assert (await say(c, "忘掉关于我的一切。"))[0] == "好的，已忘记：\n- 我的名字是张三\n- 生产数据库在杭州"
        assert await listed(c) == []
        await say(c, "Call me Bobby")
        await new_session(c)
        assert (await say(c, "忘掉所有"))[0] == "好的，已忘记：\n- Call me Bobby"
        assert await listed(c) == []
        await c.close()
        await b.close()


async def test_a_request_to_forget_names_mixed_script_subjects_preferences_nicknames_and_own_things(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        for said in ("Redis地址是10.0.0.5", "MySQL端口是3306", "Please always answer in Chinese", "Call me Bobby",
                     "My home address is 12 Elm Street", "以后请用中文回答", "The nginx port is 8080"):
            await say(c, said)
        await new_session(c)
        assert (await say(c, "忘掉Redis地址"))[0] == "好的，已忘记：\n- Redis地址是10.0.0.5"
        assert (await say(c, "请忘记MySQL端口"))[0] == "好的，已忘记：\n- MySQL端口是3306"
        assert (await say(c, "Forget my nickname"))[0] == "OK, I've forgotten:\n- Call me Bobby"
        assert (await say(c, "Forget my address"))[0] == "OK, I've forgotten:\n- My home address is 12 Elm Street"
        assert (await say(c, "Forget that I asked you to answer in Chinese."))[0] == \
            "OK, I've forgotten:\n- 以后请用中文回答"      # (the newest language preference replaced the first)
        assert await listed(c) == ["The nginx port is 8080"]
        await c.close()


async def test_a_request_to_forget_that_matches_nothing_says_so_and_where_to_look(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await say(c, "The nginx port is 8080")
        await new_session(c)
        answer, _ = await say(c, "Forget my nickname")
        assert answer == f"{NOTHING_EN}\n- my nickname\n{WHERE_EN}"
        answer, _ = await say(c, "忘掉Redis地址")
        assert answer == f"{NOTHING_ZH}\n- Redis地址\n{WHERE_ZH}"
        answer, _ = await say(c, "Forget the nginx port. Forget my nickname.")        # one matched, one not
        assert answer == f"OK, I've forgotten:\n- The nginx port is 8080\n\n{NOTHING_EN}\n- my nickname\n{WHERE_EN}"
        assert await listed(c) == []
        await c.close()


async def test_forget_what_i_said_about_a_subject_is_no_history_search(tmp_path):
    async with wired_server(tmp_path) as (_, addr):
        c = await connect(addr, "alice")
        await say(c, "The DB host is db-1.")
        await say(c, "The DB host port is 5432.")
        await new_session(c)
        answer, end = await say(c, "Forget what I said about the DB host")
        assert answer == "OK, I've forgotten:\n- The DB host is db-1."
        assert end["message"]["metadata"]["intents"] == ["forget"]
        assert not end["message"].get("tool_calls")                      # (no history search)
        assert await listed(c) == ["The DB host port is 5432."]
        await c.close()


def test_a_long_list_of_forgotten_items_is_cut_with_a_count():
    from server.agent.answers import MAX_FORGOTTEN_LISTED, noted
    texts = [f"Fact number {n} is x{n}" for n in range(MAX_FORGOTTEN_LISTED + 5)]
    answer = noted([("forget", "everything")], False, forgotten=[("everything", texts)])
    lines = answer.splitlines()
    assert lines[0] == "OK, I've forgotten:" and lines[1:-1] == [f"- {t}" for t in texts[:MAX_FORGOTTEN_LISTED]]
    assert lines[-1] == "- ... and 5 more"
    assert noted([("forget", "所有")], True, forgotten=[("所有", texts)]).splitlines()[-1] == "- ……另有 5 条"

"""Knowledge-base answers, offline routing and citation checking (review s33), over real servers on
loopback TCP:

1. the citations a model writes are checked against the passages of the turn: a made-up one is
   recorded as unverified (metadata, route reason, never "Sources:"), an answer citing nothing
   stores no citations;
2. the offline agent quotes nothing for a question whose rarest term or name no passage holds, and
   says what it did not find ("nothing about “SLA”"), in English and Chinese; a leading "，" is not
   searched; an English question naming something the Chinese documents hold is answered from them;
3. Chinese content words with a stop character (过期) count: "缓存的过期时间是多少秒？" and the follow-up
   "那过期时间呢？" are answered from the documents, not by the clock;
4. a personal vpn.md and a group's vpn.md are two files, not two versions: no "the newest", the
   group's passage names its group;
5. a section named only by its heading ranks over one that mentions the term in passing;
6. a follow-up chain keeps the topic of the last documents answer.
"""
from __future__ import annotations

import orjson

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from server.agent import knowledge_answer, knowledge_route
from server.knowledge.rerank import rerank
from testkit.scripted_llm import Reply, ScriptedLLM, ToolCallSpec

RUNBOOK = b"""# Database operations runbook

This runbook covers the PostgreSQL clusters of the payments platform.

## Backup

The nightly backup runs at 02:30 UTC from the host bk-3.internal using pgBackRest.
Full backups are kept on disk for 14 days; incremental backups for 7 days.

## Environments

### Production

The production primary is db-prod-01 on port 5432. The replica is db-prod-02.
Maintenance window: Sunday 01:00-03:00 UTC.

### Staging

The staging database is db-stage-03 on port 5433. Staging is refreshed from production every Monday.
Maintenance window on staging: any time, no approval needed.
"""
OPS = """# 网关运维手册

## 健康检查

网关的健康检查间隔是 10 秒，连续 3 次失败后将节点摘除。

## 缓存

Redis 的端口是 6380，密码由 Vault 管理，不写在文档里。
缓存过期时间默认为 300 秒。
""".encode()
#: a log that says "payment-api" in every line: shares two of the three terms of "the SLA of the payments API"
APP_LOG = "".join(f"2026-11-27 03:{i // 60:02d}:{i % 60:02d} INFO payment-api: request {1000 + i} served in "
                  f"{20 + i % 50} ms\n" for i in range(200)).encode()


def llm_section(llm: ScriptedLLM) -> dict:
    return {"base_url": llm.base_url, "api_key": "sk-test-123", "model": "m", "request_timeout_s": 5.0, "retries": 0}


# -- 1. citations the model writes are checked ---------------------------------------------------------
async def test_a_made_up_citation_is_unverified_and_an_answer_citing_nothing_stores_no_sources(tmp_path):
    async with ScriptedLLM(model="m") as llm:
        async with wired_server(tmp_path, llm=llm_section(llm), summarization={"enabled": False}) as (srv, addr):
            c = await connect(addr, "alice")
            await raw_upload(c, "runbook.md", RUNBOOK)
            made_up = "[vendor-secrets.pdf §p. 4]"
            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "backup host of the production and staging database"}')),
                     Reply.text(f"The backup host is bk-3.internal [runbook.md §Database operations runbook > Backup] "
                                f"and the vendor key is 42 {made_up}."))
            end, _ = await chat(c, "which host runs the backup?")
            meta, route = end["message"]["metadata"], end["context"]["route"]
            [result] = [orjson.loads(t["result"]) for t in end["message"]["tool_calls"]]
            assert len(result["passages"]) > 1                      # more was retrieved than cited
            assert [x["citation"] for x in meta["citations"]] == \
                [p["citation"] for p in result["passages"] if "Backup" in p["citation"]]
            assert meta["unverified_citations"] == [made_up]
            assert route["unverified_citations"] == [made_up] and made_up in route["reason"]
            md = (await c.call(MsgType.HISTORY_EXPORT, format="markdown"))["content"]
            [sources] = [line for line in md.splitlines() if line.startswith("Sources:")]
            assert "runbook.md §Database operations runbook > Backup" in sources and made_up not in sources

            llm.push(Reply.tools(ToolCallSpec("c1", "search_knowledge", '{"query": "kafka cluster password"}')),
                     Reply.text("Your documents do not mention Kafka."))
            end, _ = await chat(c, "what is the kafka password?")
            assert end["message"]["tool_calls"] and "citations" not in end["message"]["metadata"]
            assert "unverified_citations" not in end["message"]["metadata"]
            md = (await c.call(MsgType.HISTORY_EXPORT, format="markdown"))["content"]
            assert sum(line.startswith("Sources:") for line in md.splitlines()) == 1    # the first answer's only
            await c.close()


def test_a_written_citation_matches_its_passage_or_the_start_of_its_location():
    passage = "[runbook.md §Ops > Restore, lines 12-14]"
    assert knowledge_answer._cited(passage, passage)
    assert knowledge_answer._cited("[runbook.md §Ops > Restore]", passage)
    assert not knowledge_answer._cited("[runbook.md §Ops > Backup]", passage)
    assert not knowledge_answer._cited("[other.md §Ops > Restore]", passage)


# -- 2. the rarest term or a name must be in a quoted passage -----------------------------------------
async def test_a_question_whose_subject_no_passage_holds_quotes_nothing_and_names_it(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for name, data in (("runbook.md", RUNBOOK), ("运维手册.md", OPS), ("app.log", APP_LOG)):
            await raw_upload(c, name, data)
        cases = [
            ("What is the SLA of the payments API?", "missing_term", "I found nothing about “SLA” in your documents."),
            ("Who approves production deployments?", "missing_term",
             "I found nothing about “deployments” in your documents."),
            ("What is the password of the Kafka cluster according to my documents?", "keyword",
             "I found nothing about “Kafka” in your documents."),
            ("根据知识库，Kafka 集群的密码是什么？", "keyword", "知识库里没有找到关于“Kafka”的内容。"),
        ]
        for question, method, expected in cases:
            await c.call(MsgType.SESSION_NEW)
            end, _ = await chat(c, question)
            assert end["context"]["route"]["route"] == "knowledge" and end["context"]["route"]["method"] == method
            assert end["message"]["content"] == expected, question
            assert "citations" not in end["message"]["metadata"], question
        assert end["context"]["route"]["query"] == "Kafka 集群的密码是什么？"       # no stray "，" in front

        await c.call(MsgType.SESSION_NEW)                     # an English question naming what Chinese documents hold
        end, _ = await chat(c, "What is the port of Redis?")
        assert end["context"]["route"]["method"] == "strong_match"
        assert "> Redis 的端口是 6380" in end["message"]["content"]
        end, _ = await chat(c, "What is the Kafka port?")    # naming what they do not hold: no generic refusal
        assert end["context"]["route"]["method"] == "missing_term"
        assert end["message"]["content"] == "I found nothing about “Kafka” in your documents."
        await c.close()


def test_names_and_the_query_of_a_question():
    assert set(knowledge_route.names("What is the SLA of the payments API?").values()) == {"SLA", "API"}
    assert set(knowledge_route.names("根据知识库，Kafka 集群的密码是什么？").values()) == {"Kafka"}
    assert set(knowledge_route.names("Which host is the production primary database?")) == set()
    assert "db-prod-01" in knowledge_route.names("is db-prod-01 the primary?").values()
    assert knowledge_route._query("根据知识库，Kafka 集群的密码是什么？") == "Kafka 集群的密码是什么？"


# -- 3. Chinese content words with a stop character ---------------------------------------------------
def test_a_pair_with_a_content_stop_character_is_a_word():
    for pair in ("过期", "有效", "到期", "存在", "缓存"):
        assert knowledge_route._is_word(pair), pair
    for pair in ("的过", "它的", "那过", "因为", "存的"):
        assert not knowledge_route._is_word(pair), pair


async def test_chinese_questions_with_time_words_are_answered_from_the_documents(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "运维手册.md", OPS)
        await raw_upload(c, "备份说明.txt", "数据库备份说明\n\n每晚的全量备份在凌晨 2 点 30 分运行，由 bk-3 主机执行。\n".encode())
        for question, expected in (("缓存的过期时间是多少秒？", "缓存过期时间默认为 300 秒"),
                                   ("夜间备份几点运行？", "凌晨 2 点 30 分运行")):
            await c.call(MsgType.SESSION_NEW)
            end, _ = await chat(c, question)
            assert end["context"]["route"]["route"] == "knowledge", question
            assert expected in end["message"]["content"] and "现在是" not in end["message"]["content"]
        await c.call(MsgType.SESSION_NEW)
        end, _ = await chat(c, "Redis 的端口是多少")
        assert "6380" in end["message"]["content"]
        end, _ = await chat(c, "那过期时间呢？")            # a follow-up, before the clock
        assert end["context"]["route"]["method"] == "follow_up"
        assert "缓存过期时间默认为 300 秒" in end["message"]["content"]
        end, _ = await chat(c, "那现在几点？")              # nothing but the time: still the clock
        assert end["context"]["route"]["method"] == "intent"
        assert [t["tool_name"] for t in end["message"]["tool_calls"]] == ["clock"]
        await c.close()


# -- 4. a personal and a group file of one name --------------------------------------------------------
async def test_a_personal_and_a_group_file_of_one_name_are_not_versions(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        alice, carol = await connect(addr, "alice"), await connect(addr, "carol")     # both in group red
        await raw_upload(carol, "vpn.md", b"# VPN\n\nThe VPN gateway is vpn-team.example.net, port 1194 over UDP.\n",
                         collection="group:red")
        await raw_upload(alice, "vpn.md", b"# VPN\n\nThe VPN gateway is vpn-home.example.org, port 51820.\n")
        end, _ = await chat(alice, "What is the VPN gateway port?")
        content = end["message"]["content"]
        assert "1194" in content and "51820" in content
        assert "newest" not in content and "uploaded" not in content
        assert "— [vpn.md §VPN, line 3] (group red)" in content
        assert content.count("— [vpn.md §VPN, line 3]\n") + content.endswith("— [vpn.md §VPN, line 3]") == 1
        assert {x.get("collection") for x in end["message"]["metadata"]["citations"]} == {"personal", "group:red"}
        await alice.call(MsgType.SESSION_NEW)
        end, _ = await chat(alice, "VPN 网关的端口是多少？")
        assert "— [vpn.md §VPN, line 3]（群组 red）" in end["message"]["content"]
        await alice.close()
        await carol.close()


def test_only_passages_of_one_collection_are_versions_of_a_file():
    call = type("Call", (), {"tool_name": "search_knowledge", "status": "success"})()
    passage = {"citation": "[vpn.md §VPN, line 3]", "text": "The VPN gateway port is {}.", "score": 1.0}
    call.result = orjson.dumps({"passages": [
        {**passage, "doc_id": "a", "collection": "personal", "uploaded_at": "2026-11-27T10:00:00Z"},
        {**passage, "doc_id": "b", "collection": "group:red", "uploaded_at": "2026-11-27T09:00:00Z"},
        {**passage, "doc_id": "c", "collection": "group:red", "uploaded_at": "2026-11-27T11:00:00Z"}]}).decode()
    assert knowledge_answer.upload_times(call) == {"b": "2026-11-27T09:00:00Z", "c": "2026-11-27T11:00:00Z"}


# -- 5. a section named by its heading ----------------------------------------------------------------
def test_the_section_named_by_its_heading_ranks_over_one_mentioning_the_term():
    chunks = {"staging": ("The staging database is db-stage-03. Staging is refreshed from production every "
                          "Monday.\nMaintenance window on staging: any time, no approval needed.",
                          ["Runbook", "Environments", "Staging"]),
              "production": ("The production primary is db-prod-01 on port 5432.\nMaintenance window: Sunday "
                             "01:00-03:00 UTC.", ["Runbook", "Environments", "Production"])}
    ranked = rerank("When is the maintenance window on production?", [("production", 10.0), ("staging", 9.8)],
                    chunks.__getitem__, lambda term: 1, 10)
    assert [key for key, _ in ranked] == ["production", "staging"]


# -- 6. a follow-up chain keeps its topic -------------------------------------------------------------
async def test_a_follow_up_chain_keeps_the_topic_of_the_last_documents_answer(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", RUNBOOK)
        end, _ = await chat(c, "Which host is the production primary database?")
        assert "db-prod-01" in end["message"]["content"]
        for follow_up in ("and on staging?", "what about its port?", "and the maintenance window?"):
            end, _ = await chat(c, follow_up)
            route, content = end["context"]["route"], end["message"]["content"]
            assert route["method"] == "follow_up", follow_up
            first = content.split("\n\n— ")[0]
            assert "staging" in first and "db-prod-01" not in first, (follow_up, content)
        assert "Staging" in route["query"] and "Maintenance window on staging" in content
        await c.close()


def test_the_topic_of_an_answer_is_the_last_heading_of_its_first_citation():
    answer = "From your documents:\n\n> x\n\n— [runbook.md §Runbook > Environments > Staging, lines 26-27]"
    assert knowledge_route.topic(answer) == "Staging"
    assert knowledge_route.topic("From your documents:\n\n> x\n\n— [app.log §lines 3-9]") == ""
    assert knowledge_route.topic("no citation") == ""

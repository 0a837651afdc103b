"""S33 (fixer route2): the offline knowledge route's rules for names lost correct answers; over real
servers on loopback TCP (the production wiring, the offline agent):

1. a name no document holds refuses only when the best passage does not hold everything else the
   question asks: "How often are the SSL certificates renewed?" quotes "TLS certificates are renewed
   by certbot every 60 days" with a note (before: "I found nothing about “SSL”"); so do "LB",
   "HTTPS", "Postgres", "NAS" and "CLI" (发布回滚的 CLI 命令是什么？). "What is the SLA of the payments
   API?" and "根据知识库，Kafka 集群的密码是什么？" still say the documents have nothing about it;
2. "I found nothing about X" never names a word a passage found holds: "Where do the PagerDuty
   alerts go on Sunday?" quotes the PagerDuty passage (before: nothing about “PagerDuty” or “Sunday”);
   "redis 连接超时怎么办" says no passage mentions both;
3. the answer follows the route: "PostgreSQL 主库的端口是多少？" quotes "端口 5432" (the route's best
   passage), and a piece of an identifier is no name: "When does the DB backup run?" quotes the
   Backup section, not the sections holding db-prod-01;
6. "今天备份失败了吗" is no clock request.
"""
from __future__ import annotations

import orjson

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from server.agent import intents, knowledge_answer, knowledge_route

RUNBOOK = b"""# Database operations runbook

This runbook covers the PostgreSQL clusters of the payments platform.

## Backup

The nightly backup runs at 02:30 UTC from the host bk-3.internal using pgBackRest.
Full backups are kept on disk for 14 days; incremental backups for 7 days.
To restore a backup, run the restore script on the standby and promote it.

## Environments

### Production

The production primary is db-prod-01 on port 5432. The replica is db-prod-02.
Maintenance window: Sunday 01:00-03:00 UTC.

### Staging

The staging database is db-stage-03 on port 5433. Staging is refreshed from production every Monday.
Maintenance window on staging: any time, no approval needed.

## Monitoring

Alerts go to the on-call engineer through PagerDuty. The disk usage alert fires above 85 percent.
CPU alert threshold is 90 percent for five minutes.

## Web tier

The nginx reverse proxy listens on port 443 and forwards to the app servers app-1 and app-2.
TLS certificates are renewed by certbot every 60 days.
The load balancer health check interval is 10 seconds.
"""
OPS = """# 网关运维手册

## 健康检查

网关的健康检查间隔是 10 秒，连续 3 次失败后将节点摘除。

## 缓存

Redis 的端口是 6380，密码由 Vault 管理，不写在文档里。
缓存过期时间默认为 300 秒。

## 数据库

主库地址是 db-prod-01，端口 5432。每天凌晨 2 点 30 分执行全量备份，备份保留 14 天。
从库是 db-prod-02，用于只读查询。

## 发布流程

发布需要经过测试环境验证，然后由值班负责人审批。回滚使用 deploy 脚本的 rollback 命令。
""".encode()
GATEWAY = "# 网关说明\n\n## 健康检查\n网关的健康检查间隔是 15 秒，超时 3 秒。网关监听 8443 端口。\n".encode()
#: a log that says "payment-api" in every line (payment and api, but no standalone "API")
APP_LOG = "".join(f"2026-11-27 03:{i // 60:02d}:{i % 60:02d} INFO payment-api: request {1000 + i} served in "
                  f"{20 + i % 50} ms\n" for i in range(200)).encode()


async def _ask(c, question: str) -> tuple[dict, str, list[str]]:
    await c.call(MsgType.SESSION_NEW)
    end, _ = await chat(c, question)
    citations = [x["citation"] for x in end["message"]["metadata"].get("citations", [])]
    return end["context"]["route"], end["message"]["content"], citations


# -- 1. a name in no document refuses only what the passage does not otherwise answer ---------------
async def test_a_name_the_documents_phrase_differently_still_gets_the_passage_that_answers(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for name, data in (("runbook.md", RUNBOOK), ("ops.md", OPS), ("app.log", APP_LOG)):
            await raw_upload(c, name, data)
        cases = [
            ("How often are the SSL certificates renewed?", "TLS certificates are renewed by certbot every 60 days",
             "(The text quoted does not mention “SSL”.)"),
            ("What is the LB health check interval?", "The load balancer health check interval is 10 seconds",
             "(The text quoted does not mention “LB”.)"),
            ("What's the HTTPS port of nginx?", "The nginx reverse proxy listens on port 443",
             "(The text quoted does not mention “HTTPS”.)"),
            ("What is the port of the Postgres replica?", "The production primary is db-prod-01 on port 5432",
             "(The text quoted does not mention “Postgres”.)"),
            ("How many days are backups kept on the NAS?", "Full backups are kept on disk for 14 days",
             "(The text quoted does not mention “NAS”.)"),
            ("发布回滚的 CLI 命令是什么？", "回滚使用 deploy 脚本的 rollback 命令", "（以上内容未提到“CLI”。）"),
        ]
        for question, quoted, note in cases:
            route, content, citations = await _ask(c, question)
            assert route["method"] == "strong_match", (question, route)
            assert content.startswith(("From your documents:", "知识库中的相关内容：")), (question, content)
            assert quoted in content and content.endswith(note), (question, content)
            assert citations and "nothing" not in content, (question, content)
        # today's wins stay: a name in no document that the best passage does not otherwise answer
        route, content, citations = await _ask(c, "What is the SLA of the payments API?")
        assert route["method"] == "missing_term" and not citations
        assert content == "I found nothing about “SLA” in your documents."
        route, content, citations = await _ask(c, "根据知识库，Kafka 集群的密码是什么？")
        assert route["method"] == "keyword" and not citations
        assert content == "知识库里没有找到关于“Kafka”的内容。"
        route, content, _ = await _ask(c, "What is the Kafka port?")
        assert route["method"] == "missing_term" and content == "I found nothing about “Kafka” in your documents."
        await c.close()


def test_a_piece_of_an_identifier_is_no_name_and_the_rest_of_a_question_must_be_held():
    named = knowledge_route.names("When does the DB backup run?")
    assert knowledge_route.held_names(named, "The production primary is db-prod-01 on port 5432.") == set()
    assert knowledge_route.held_names(named, "Database operations runbook") == {"DB"}
    assert knowledge_route.held_names(named, "主库的端口 网关运维手册 数据库") == {"DB"}      # (in either language)
    api = knowledge_route.names("What is the SLA of the payments API?")
    assert knowledge_route.held_names(api, "INFO payment-api: request 1001 served") == set()
    assert knowledge_route.held_names(knowledge_route.names("What is the Kafka port?"), "a Kafka-based queue") == {"Kafka"}
    ssl = "How often are the SSL certificates renewed?"
    assert knowledge_route.holds_the_rest(ssl, knowledge_route.names(ssl), ["SSL"],
                                          "TLS certificates are renewed by certbot every 60 days.")
    kafka = "根据知识库，Kafka 集群的密码是什么？"
    assert not knowledge_route.holds_the_rest(kafka, knowledge_route.names(kafka), ["Kafka"],
                                              "Redis 的端口是 6380，密码由 Vault 管理，不写在文档里。")
    cli = "发布回滚的 CLI 命令是什么？"
    assert knowledge_route.holds_the_rest(cli, knowledge_route.names(cli), ["CLI"],
                                          "发布需要经过测试环境验证，然后由值班负责人审批。回滚使用 deploy 脚本的 rollback 命令。")


# -- 2. "nothing about X" never names what a passage found holds ---------------------------------------
async def test_nothing_about_never_names_a_word_a_passage_holds(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", RUNBOOK)
        await raw_upload(c, "ops.md", OPS)
        await raw_upload(c, "网关.md", GATEWAY)
        route, content, citations = await _ask(c, "Where do the PagerDuty alerts go on Sunday?")
        assert route["method"] == "strong_match" and "'Sunday'" in route["reason"], route
        assert "> Alerts go to the on-call engineer through PagerDuty." in content
        assert "nothing about" not in content and content.endswith("(The text quoted does not mention “Sunday”.)")
        assert citations == ["[runbook.md §Database operations runbook > Monitoring, lines 25-26]"]
        route, content, citations = await _ask(c, "redis 连接超时怎么办")     # both held, never together
        assert route["method"] == "missing_term" and not citations
        assert content == "知识库里没有找到同时提到“redis”和“超时”的内容。", content
        await c.close()


def test_the_answer_says_nothing_about_only_what_no_passage_found_holds():
    call = type("Call", (), {"tool_name": "search_knowledge", "status": "success"})()
    call.result = orjson.dumps({"passages": [
        {"citation": "[r.md §Monitoring]", "text": "Alerts go to the on-call engineer through PagerDuty.", "score": 2.0},
        {"citation": "[r.md §Production]", "text": "Maintenance window: Sunday 01:00-03:00 UTC.", "score": 1.0}]}).decode()
    focus = knowledge_route.Focus("Where do the PagerDuty alerts go on Sunday?")    # (no route decision: keyword)
    content, citations = knowledge_answer.answer(call, False, focus)
    assert "nothing" not in content and "> Alerts go to the on-call engineer through PagerDuty." in content
    assert [x["citation"] for x in citations] == ["[r.md §Monitoring]"]
    focus.decided, focus.absent = "nothing", ("Sunday",)        # a route that found Sunday missing: held here
    content, _ = knowledge_answer.answer(call, False, focus)
    assert content == "I found nothing in your documents that mentions both “PagerDuty” and “Sunday”."


# -- 3. the answer follows the route; an identifier's piece is no name ----------------------------------
async def test_the_answer_quotes_the_passage_the_route_judged(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", RUNBOOK)
        await raw_upload(c, "ops.md", OPS)
        route, content, citations = await _ask(c, "PostgreSQL 主库的端口是多少？")
        assert route["method"] == "strong_match", route
        assert "> 主库地址是 db-prod-01，端口 5432。" in content and "This runbook covers" not in content
        assert citations == ["[ops.md §网关运维手册 > 数据库, lines 14-15]"]
        assert content.endswith("（以上内容未提到“PostgreSQL”。）")
        route, content, citations = await _ask(c, "When does the DB backup run?")
        assert route["method"] == "strong_match", route
        assert citations[0] == "[runbook.md §Database operations runbook > Backup, lines 7-9]"
        assert "db-prod-01" not in content and "The nightly backup runs at 02:30 UTC" in content
        await c.close()


# -- 6. "did it happen today?" is no clock request -------------------------------------------------------
def test_today_in_a_question_about_what_happened_is_no_clock_request():
    for text in ("今天备份失败了吗", "did the backup fail today?", "今天 redis 重启了吗"):
        assert "clock" not in [i.name for i in intents.parse(text)], text
    for text in ("今天几号", "今天星期几", "今天是什么日子", "今天？", "what's the date today?", "what is today?", "现在几点"):
        assert [i.name for i in intents.parse(text)] == ["clock"], text


async def test_a_question_whether_the_backup_failed_today_reads_no_clock(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "ops.md", OPS)
        end, _ = await chat(c, "今天备份失败了吗")
        assert end["context"]["route"]["method"] != "intent", end["context"]["route"]
        assert end["message"]["tool_calls"] == [] and "现在是" not in end["message"]["content"]
        await c.close()

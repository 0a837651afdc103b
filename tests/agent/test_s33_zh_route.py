"""S33 (review zh, F4): questions about the live machine are not answered from the documents.

With documents uploaded (a Chinese runbook that mentions CPU alerts, Redis and the gateway's port),
over loopback TCP against the production wiring (the offline agent):

1. "现在 CPU 超过 90% 了吗" reads the CPU (before: it quoted "CPU 持续 5 分钟超过 90% 会发送短信"); a
   question about a setting, "目前磁盘使用率超过多少会触发告警", is still answered from the documents;
2. "最近有没有 OOM", "nginx 有没有报错" (what happens on the machine, no tool reads it) get the general
   route (before: missing_term, "知识库里没有找到相关内容。"); a question the documents could answer that
   they do not is still missing_term;
3. "redis 连接超时怎么办": a passage about Redis that says nothing about 超时 is not what it is about;
4. "网关的 8443 端口通吗" after a documents answer checks the port (before: a follow-up quoting the
   document).
"""
from __future__ import annotations

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from server.agent import knowledge_route

OPS = """# 运维手册

## 备份
夜间备份每天凌晨 2 点运行，备份保留 14 天。备份服务器是 bk-3.internal。

## 告警
磁盘使用率超过 85% 会触发告警，CPU 持续 5 分钟超过 90% 会发送短信。

## Redis
Redis 的端口是 6380，缓存的过期时间是 3600 秒。
""".encode()
GATEWAY = """# 网关说明

## 健康检查
网关的健康检查间隔是 15 秒，超时 3 秒。网关监听 8443 端口。
""".encode()


def tools(tmp_path) -> dict:
    return {"file_roots": [str(tmp_path)], "allowed_hosts": ["127.0.0.1", "localhost"]}


def test_live_readings_and_machine_questions_are_told_apart():
    assert knowledge_route.live_reading("现在 CPU 超过 90% 了吗", ["cpu"])
    assert knowledge_route.live_reading("CPU usage on web-01 right now?", ["cpu"])
    assert not knowledge_route.live_reading("目前 CPU 告警阈值是多少", ["cpu"])        # a setting
    assert not knowledge_route.live_reading("磁盘使用率超过多少会触发告警", ["disk"])  # no "now"
    assert not knowledge_route.live_reading("目前夜间备份几点运行", ["clock"])
    for text in ("最近有没有 OOM", "nginx 有没有报错", "did the backup fail last night?", "is nginx down?",
                 "今天 redis 重启了吗", "any errors recently?"):
        assert knowledge_route.about_the_machine(text), text
    for text in ("redis 连接超时怎么办", "What is the SLA of the payments API?", "网关监听哪个端口",
                 "nginx 报错 502 怎么办", "Who approves production deployments?", "目前 Kafka 的端口是多少"):
        assert not knowledge_route.about_the_machine(text), text


async def test_live_machine_questions_keep_their_tool_or_the_general_route(tmp_path):
    async with wired_server(tmp_path, tools=tools(tmp_path)) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "运维手册.md", OPS)
        await raw_upload(c, "网关.md", GATEWAY)

        end, _ = await chat(c, "现在 CPU 超过 90% 了吗")
        route, msg = end["context"]["route"], end["message"]
        assert (route["route"], route["method"]) == ("general", "intent"), route
        assert [t["tool_name"] for t in msg["tool_calls"]] == ["sys_monitor"] and "发送短信" not in msg["content"]

        await c.call(MsgType.SESSION_NEW)
        end, _ = await chat(c, "目前磁盘使用率超过多少会触发告警")        # a setting: the documents
        assert end["context"]["route"]["route"] == "knowledge", end["context"]["route"]
        assert "磁盘使用率超过 85% 会触发告警" in end["message"]["content"]

        for question in ("最近有没有 OOM", "nginx 有没有报错"):
            await c.call(MsgType.SESSION_NEW)
            end, _ = await chat(c, question)
            route, msg = end["context"]["route"], end["message"]
            assert (route["route"], route["method"]) == ("general", "default"), (question, route)
            assert msg["tool_calls"] == [] and "知识库" not in msg["content"], (question, msg["content"])

        await c.call(MsgType.SESSION_NEW)
        end, _ = await chat(c, "Kafka 的端口是多少？")                     # the documents could answer: missing_term
        assert end["context"]["route"]["method"] == "missing_term"
        assert "Kafka" in end["message"]["content"]
        await c.close()


async def test_a_passage_naming_redis_without_the_timeout_is_not_what_a_timeout_question_is_about(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "运维手册.md", OPS)
        await raw_upload(c, "网关.md", GATEWAY)
        source, user = srv.agent.registry.knowledge, "alice"
        focus = await knowledge_route.focus_of(source, user, "redis 连接超时怎么办")
        assert focus.beside == {"超时"}                          # (连接 is in no passage: not asked for)
        route = await knowledge_route.decide("redis 连接超时怎么办", [{"role": "user", "content": "redis 连接超时怎么办"}],
                                             source, user, [])
        assert route.method == "missing_term" and "'超时'" in route.reason, route
        # a name and a term the passage holds: still a strong match, also across languages
        for question in ("Redis 的端口是多少", "What is the port of Redis?"):
            route = await knowledge_route.decide(question, [{"role": "user", "content": question}], source, user, [])
            assert route.method == "strong_match", (question, route)
        await c.close()


async def test_a_port_check_after_a_documents_answer_checks_the_port(tmp_path):
    async with wired_server(tmp_path, tools=tools(tmp_path)) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "网关.md", GATEWAY)
        end, _ = await chat(c, "网关的健康检查间隔是多少")
        assert end["context"]["route"]["route"] == "knowledge" and "15 秒" in end["message"]["content"]
        end, _ = await chat(c, "那超时呢？")                        # a follow-up of the documents answer still is
        assert end["context"]["route"]["method"] == "follow_up" and "超时 3 秒" in end["message"]["content"]
        end, _ = await chat(c, "网关的 8443 端口通吗")
        route, msg = end["context"]["route"], end["message"]
        assert (route["route"], route["method"]) == ("general", "intent"), route
        assert [t["tool_name"] for t in msg["tool_calls"]] == ["network_check"], msg["tool_calls"]
        assert "网关监听 8443 端口" not in msg["content"]
        await c.close()


async def test_a_timeout_question_quotes_no_redis_passage_without_the_timeout(tmp_path):
    """With a name (Redis), a quoted passage must also hold one of the question's other rarest key
    terms the documents hold (超时): "Redis 的端口是 6380" is not an answer to a timeout question."""
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "运维手册.md", OPS)
        await raw_upload(c, "网关.md", GATEWAY)
        end, _ = await chat(c, "redis 连接超时怎么办")
        assert end["context"]["route"]["method"] == "missing_term"
        assert "6380" not in end["message"]["content"] and "超时" in end["message"]["content"], end["message"]["content"]
        end, _ = await chat(c, "根据知识库，Kafka 的 OOM 怎么处理？")
        assert "Kafka" in end["message"]["content"], end["message"]["content"]
        await c.close()

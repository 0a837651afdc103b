"""The offline agent's knowledge answers, over a real server on loopback TCP (review s31):

1. a document question holding a tool word ("what time does the nightly backup run?", 磁盘使用率超过多少会
   触发告警, 网关的健康检查间隔是多少) or only Chinese question words (错误码 E1024 是什么意思) is answered from
   the documents, while a genuine system question ("现在几点", "how much memory is free") still runs
   its tool, with documents about disks, memory and time uploaded;
2. an edited file uploaded again under its name: a text is quoted once, and two documents' passages
   under one citation are told apart (the newest first, each with its upload time);
3. a follow-up asking what to do ("and how do I fix it?") quotes the passage that says it, rather than
   claiming the documents have nothing;
4. a live reading of the machine named by host, place or time ("is port 22 open on web-01?", 生产环境的CPU
   使用率是多少, "... right now?") keeps its tool when the documents mention that host, while a documented
   value or policy about it ("what port does web-01 use?", CPU 告警阈值是多少) is answered from them;
5. a 32,000-character system request is routed by its bounded parsed part (intents.parsed_part).
"""
from __future__ import annotations

import re

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType
from server.agent import knowledge_route
from server.agent.intents import MAX_PARSE_CHARS, parse, without_request
from server.agent.knowledge_route import match_terms

RUNBOOK = b"""# Database Runbook

## Backup

### Nightly

The nightly backup runs at 02:00 UTC on db-prod-42 using pg_basebackup.
Backups are written to s3://acme-backups/pg/ and kept for 14 days.

### Restore

To restore, stop the application, then run `restore.sh --target db-restore-7`.
The restore timeout is 45 minutes; if it is exceeded the job fails with error ERR-5031.

## Troubleshooting

Error ERR-4012 means the WAL archive is full; free space on /var/lib/pgsql/archive.
Error ERR-5031 means the restore timed out; raise restore_timeout in restore.conf.
"""
OPS = """# 运维手册

## 缓存服务

Redis 集群部署在 cache-01、cache-02 和 cache-03 三台主机上，端口为 6380。
最大内存设置为 12GB，淘汰策略为 allkeys-lru。

## 发布流程

每周二和周四下午三点发布。发布前必须在预发环境 stage-7.internal 上完成回归测试。
回滚命令为 `deploy rollback --to previous`，回滚需要大约八分钟。

## 告警处理

磁盘使用率超过百分之九十时触发 P2 告警，值班工程师需要在十五分钟内响应。
错误码 E1024 表示上游网关超时，请检查 nginx 的 proxy_read_timeout 配置。

## Mixed 混合章节

The gateway host is gw-east-2.internal，网关的健康检查路径是 /healthz，检查间隔为 10 秒。

## 防火墙规则

外部访问数据库端口 5432 一律拒绝，只允许跳板机 jump-01 访问。
""".encode()
#: documents full of the tools' own words: disks, memory, time, CPU, ports
MACHINE = b"""# Host notes

## Disks

Check free disk space and disk usage on every host before the nightly backup; the backup disk is /mnt/backup.

## Memory

The cache keeps hot keys in memory; watch free memory and swap usage during the day.

## Time

All times are UTC; the time server is ntp-1. The current date is logged with each backup.

## Ports

SSH listens on port 22 on localhost and the bastion host; check port 22 after a restart.
CPU usage and load average are graphed in Grafana.
"""

# (question, a text of the answer's passage): the reviewer's cases, each holding a tool word or question words
DOCUMENT_QUESTIONS = [
    ("what time does the nightly backup run?", "02:00 UTC"),
    ("how many days are backups kept on disk?", "kept for 14 days"),
    ("回滚需要多长时间？", "回滚需要大约八分钟"),
    ("每周几发布？", "每周二和周四下午三点发布"),
    ("值班工程师需要在多长时间内响应", "十五分钟内响应"),
    ("磁盘使用率超过多少会触发告警", "百分之九十"),
    ("Redis 的最大内存是多少", "最大内存设置为 12GB"),
    ("网关的健康检查间隔是多少", "检查间隔为 10 秒"),
    ("错误码 E1024 是什么意思", "E1024 表示上游网关超时"),
    ("Redis 的端口是多少", "端口为 6380"),
    ("Redis 的淘汰策略是什么", "allkeys-lru"),
    ("发布前必须在哪个环境完成回归测试？", "stage-7.internal"),
    ("外部能访问数据库端口 5432 吗", "外部访问数据库端口 5432 一律拒绝"),
]
# (question, the tool it must run): genuine system questions, asked with MACHINE and the others uploaded
SYSTEM_QUESTIONS = [
    ("what time is it", "clock"), ("现在几点", "clock"), ("今天星期几", "clock"), ("what's the date today?", "clock"),
    ("磁盘还剩多少", "sys_monitor"), ("磁盘使用率是多少", "sys_monitor"), ("how much memory is free", "sys_monitor"),
    ("内存还剩多少", "sys_monitor"), ("show disk usage", "sys_monitor"), ("what is the disk usage?", "sys_monitor"),
    ("how much disk space is left?", "sys_monitor"), ("查看CPU使用率", "sys_monitor"), ("服务器运行时间", "sys_monitor"),
    ("系统状态", "sys_monitor"), ("load average", "sys_monitor"), ("top processes by memory", "processes"),
    ("检查 127.0.0.1:22 端口", "network_check"), ("check port 22 on localhost", "network_check"),
]


def tools_of(end: dict) -> list[str]:
    return [t["tool_name"] for t in end["message"]["tool_calls"]]


async def test_document_questions_with_tool_words_are_answered_from_the_documents(tmp_path):
    async with wired_server(tmp_path, tools={"cpu_sample_s": 0.05}) as (srv, addr):
        c = await connect(addr, "alice")
        for name, data in (("runbook.md", RUNBOOK), ("运维手册.md", OPS), ("hosts.md", MACHINE)):
            await raw_upload(c, name, data)
        wrong = []
        for question, expected in DOCUMENT_QUESTIONS:
            end, _ = await chat(c, question)
            route, content = end["context"]["route"], end["message"]["content"]
            if route["route"] != "knowledge" or expected not in content or tools_of(end) != ["search_knowledge"]:
                wrong.append((question, route, content[:80]))
        assert wrong == []
        wrong = []
        for question, tool in SYSTEM_QUESTIONS:
            end, _ = await chat(c, question)
            route = end["context"]["route"]
            if route["method"] != "intent" or tools_of(end) != [tool] or "citations" in end["message"]["metadata"]:
                wrong.append((question, route, end["message"]["content"][:80]))
        assert wrong == []
        await c.close()


def test_a_duration_is_no_clock_request():
    for text in ("回滚需要多长时间？", "值班工程师需要在多长时间内响应", "备份要花多少时间", "how much time does a restore take?"):
        assert [i.name for i in parse(text)] == [], text
    for text in ("现在是什么时间", "what time is it", "时间", "系统时间"):
        assert [i.name for i in parse(text)] == ["clock"], text


# -- 2. an edited file uploaded again under its name ---------------------------------------------------
PROXY = "# Proxy runbook\n\n## Pool\n\nThe proxy pool is proxy-a, proxy-b and proxy-c behind lb-proxy.internal.\n\n" \
        "## Limits\n\nThe proxy connection limit is {} per node.\n"


async def test_an_edited_file_uploaded_again_is_quoted_once_per_text_and_told_apart(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "bob")
        old = (await raw_upload(c, "proxy.md", PROXY.format(2000).encode()))["document"]
        new = (await raw_upload(c, "proxy.md", PROXY.format(5000).encode()))["document"]
        assert old["doc_id"] != new["doc_id"] and old["uploaded_at"] < new["uploaded_at"]

        end, _ = await chat(c, "which hosts are in the proxy pool?")        # a section both versions share
        content = end["message"]["content"]
        assert end["context"]["route"]["route"] == "knowledge"
        assert content.count("> The proxy pool is proxy-a") == 1 and content.count("[proxy.md §") == 1
        assert "uploaded" not in content
        assert [x["doc_id"] for x in end["message"]["metadata"]["citations"]] == [new["doc_id"]]

        end, _ = await chat(c, "what is the proxy connection limit per node?")   # the section that changed
        content = end["message"]["content"]
        assert content.index("limit is 5000 per node") < content.index("limit is 2000 per node")
        when = {d["doc_id"]: d["uploaded_at"][:19].replace("T", " ") + " UTC" for d in (old, new)}
        citation = "[proxy.md §Proxy runbook > Limits, line 9]"
        assert f"— {citation} (uploaded {when[new['doc_id']]}, the newest)" in content
        assert re.search(rf"— {re.escape(citation)} \(uploaded {when[old['doc_id']]}\)\n?", content)
        assert [x["doc_id"] for x in end["message"]["metadata"]["citations"]][:2] == [new["doc_id"], old["doc_id"]]

        await c.call(MsgType.SESSION_NEW)
        end, _ = await chat(c, "proxy 的 connection limit 是多少？")            # in Chinese: the same, in Chinese
        assert f"— {citation}（上传于 {when[new['doc_id']]}，最新）" in end["message"]["content"]
        assert f"— {citation}（上传于 {when[old['doc_id']]}）" in end["message"]["content"]
        await c.close()


async def test_the_same_file_uploaded_twice_is_quoted_once(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", RUNBOOK)
        again = (await raw_upload(c, "runbook.md", RUNBOOK + b"\n"))["document"]      # other bytes, same passages
        end, _ = await chat(c, "what error code means the WAL archive is full?")
        content = end["message"]["content"]
        assert content.count("> Error ERR-4012 means the WAL archive is full") == 1
        assert content.count("— [runbook.md §Database Runbook > Troubleshooting") == 1 and "uploaded" not in content
        assert end["message"]["metadata"]["citations"][0]["doc_id"] == again["doc_id"]
        await c.close()


# -- 3. a follow-up asking what to do -----------------------------------------------------------------
async def test_a_follow_up_asking_how_to_fix_it_quotes_the_passage_that_says_it(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", RUNBOOK)
        await raw_upload(c, "运维手册.md", OPS)
        end, _ = await chat(c, "what error code means the WAL archive is full?")
        assert "ERR-4012" in end["message"]["content"]
        for follow_up in ("and how do I fix it?", "how do I resolve that?"):
            end, _ = await chat(c, follow_up)
            assert end["context"]["route"]["method"] == "follow_up", follow_up
            assert "free space on /var/lib/pgsql/archive" in end["message"]["content"], follow_up
            assert end["message"]["metadata"]["citations"][0]["name"] == "runbook.md"
        end, _ = await chat(c, "错误码 E1024 是什么意思")
        assert "E1024 表示上游网关超时" in end["message"]["content"]
        end, _ = await chat(c, "那怎么解决？")
        assert end["context"]["route"]["method"] == "follow_up"
        assert "proxy_read_timeout" in end["message"]["content"]
        end, _ = await chat(c, "and who owns it?")              # a word of its own no passage holds: still nothing
        assert end["context"]["route"]["method"] == "follow_up"
        assert end["message"]["content"] == "I found nothing about that in your documents."
        await c.close()


# -- 4. a live reading naming the machine keeps its tool (review s31 R2) --------------------------------
#: a runbook naming the host, its CPU, free memory and port: values and policies the documents hold
HOSTS = """# Runbook

## web-01

web-01 runs nginx. If CPU usage on web-01 goes above 90%, restart the php-fpm pool.

## Memory

If free memory on web-01 drops below 1 GB, check the page cache right away.

## Access

SSH to web-01 on port 22 from the VPN only.

## Web server

When the CPU usage of the web server stays above 90 percent for ten minutes, page the on-call engineer
and check the current load average right now.

## Backup

The nightly backup runs at 02:00 UTC; backups are kept on disk for 7 days.

## 告警

生产环境的CPU使用率超过90%时告警。CPU 告警阈值为 90%。磁盘使用率超过百分之九十时触发 P2 告警。
数据库服务器的内存使用率应低于 80%。
""".encode()
# (question, the tool it must run): a reading of the machine named by host, place or "right now"
LIVE_QUESTIONS = [
    ("is port 22 open on web-01?", "network_check"), ("what's the CPU usage on web-01?", "sys_monitor"),
    ("how much free memory does web-01 have?", "sys_monitor"), ("CPU usage on web-01 right now?", "sys_monitor"),
    ("生产环境的CPU使用率是多少？", "sys_monitor"), ("what's the CPU usage of the web server right now?", "sys_monitor"),
    ("what's the CPU usage right now?", "sys_monitor"), ("数据库服务器的内存使用率现在是多少？", "sys_monitor"),
]
# (question, a text of the answer's passage): a documented value or policy about the same machine
VALUE_QUESTIONS = [
    ("what port does web-01 use?", "port 22"), ("CPU 告警阈值是多少", "CPU 告警阈值为 90%"),
    ("磁盘使用率超过多少会触发告警", "百分之九十"), ("what time does the nightly backup run?", "02:00 UTC"),
    ("how many days are backups kept on disk?", "7 days"),
]


async def test_a_live_reading_naming_the_machine_keeps_its_tool(tmp_path):
    async with wired_server(tmp_path, tools={"cpu_sample_s": 0.05, "network_timeout_s": 0.2}) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "runbook.md", HOSTS)
        wrong = []
        for question, tool in LIVE_QUESTIONS:
            end, _ = await chat(c, question)
            route = end["context"]["route"]
            if route["method"] != "intent" or tools_of(end) != [tool] or "citations" in end["message"]["metadata"]:
                wrong.append((question, route, end["message"]["content"][:80]))
        assert wrong == []
        for question, expected in VALUE_QUESTIONS:
            end, _ = await chat(c, question)
            route, content = end["context"]["route"], end["message"]["content"]
            if route["route"] != "knowledge" or expected not in content or tools_of(end) != ["search_knowledge"]:
                wrong.append((question, route, content[:80]))
        assert wrong == []
        await c.close()


def test_the_machine_a_reading_is_taken_on_is_part_of_the_request():
    assert match_terms("is port 22 open on web-01?", request=True) == set()
    assert match_terms("what's the CPU usage of the web server right now?", request=True) == set()
    assert match_terms("生产环境的CPU使用率是多少？", request=True) == set()
    assert match_terms("what is the CPU alert threshold on web-01?", request=True) == {"alert", "threshold"}
    assert match_terms("what time does the nightly backup run?", request=True) == {"nightli", "backup", "run"}


# -- 5. a long message costs the route no more than a short one (review s31 R2) ----------------------
async def test_a_long_system_request_is_routed_by_its_parsed_part(tmp_path, monkeypatch):
    seen: list[int] = []

    def recording(text: str) -> str:
        seen.append(len(text))
        return without_request(text)

    monkeypatch.setattr(knowledge_route, "without_request", recording)
    async with wired_server(tmp_path, tools={"cpu_sample_s": 0.05}) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "ops.md", b"# Ops\n\nThe CPU usage alert fires at 90 percent on the batch hosts.\n")
        for filler in ("a." * 16000, "之前" * 16000):
            end, _ = await chat(c, ("what is the cpu usage? " + filler)[:32000])
            assert end["context"]["route"]["method"] == "intent" and tools_of(end) == ["sys_monitor"]
        assert seen and max(seen) <= MAX_PARSE_CHARS + 1
        seen.clear()
        end, _ = await chat(c, "when does the CPU usage alert fire?")    # a short message: whole, as before
        assert seen == [len("when does the CPU usage alert fire?")]
        assert end["context"]["route"]["method"] == "strong_match" and "fires at 90 percent" in end["message"]["content"]
        await c.close()

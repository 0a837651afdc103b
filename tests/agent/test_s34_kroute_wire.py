"""The offline knowledge route in English and mixed live + documents questions (review s34, F5 and F6),
over a real server on loopback TCP with two runbooks uploaded:

F5. a question the documents plainly answer is answered from them, never "I found nothing about …" a
    word that only says what is done ("kept", "use") or "cannot handle": "how many days of backups are
    kept?" (the runbook says "keeps"), "what port does the production database use?", "how long are
    backups kept?", "Who do I escalate to?" (one search word); "the runbook" names the documents
    ("what does the runbook say to do when swap is high?" quotes the runbook, reads no memory);
    a noun no passage holds still gets "nothing about" it;
F6. a question that names a live reading and asks it against the documents gets both, the reading and
    the quoted passage, and says whether the reading is above the quoted value (same unit) or that no
    comparison was made: the disk against the disk runbook's thresholds, swap against the swap limit
    (in English and Chinese); a reading question with no setting word keeps its plain reading.
"""
from __future__ import annotations

import orjson

from kb_wire.kbwire import chat, connect, raw_upload, wired_server
from protocol import MsgType

DISK_RUNBOOK = b"""# Disk runbook

## Thresholds
The disk usage alert fires when any filesystem is above 85% for 10 minutes.
At 95% the on-call engineer must page the storage team.

## Cleanup
To free space, rotate logs with logrotate and remove old core dumps from /var/crash.
Never delete files under /var/lib/postgresql.
"""
ONCALL = b"""# On-call runbook

## Backup
The nightly backup runs at 02:30 UTC on host bk-3.internal and keeps 14 days of backups.

## Database
The production primary database is db-7.internal on port 5432.
The staging database is db-stage-2.internal on port 5433.

## Memory
If swap usage is above 50% for 15 minutes, restart the worker pool after checking with the team lead.
The memory alert threshold is 90% of RAM.

## Escalation
Escalate to the SRE lead Alice Wong after 30 minutes without resolution.
"""
ZH_RUNBOOK = "# 磁盘手册\n\n## 告警\n磁盘使用率超过 80% 时触发告警。\n".encode()


async def _runbooks(c) -> None:
    await raw_upload(c, "disk-runbook.md", DISK_RUNBOOK)
    await raw_upload(c, "oncall.md", ONCALL)


async def _ask(c, question: str) -> tuple[dict, str, list[str], list[dict]]:
    await c.call(MsgType.SESSION_NEW)
    end, _ = await chat(c, question)
    calls = end["message"]["tool_calls"]
    return end["context"]["route"], end["message"]["content"], [t["tool_name"] for t in calls], calls


def _relation(value: float, limits: list[float]) -> str:
    words = []
    for word, vs in (("above", [v for v in limits if value > v]), ("at", [v for v in limits if value == v]),
                     ("below", [v for v in limits if value < v])):
        if vs:
            words.append(f"{word} {' and '.join(f'{v:g}%' for v in vs)}")
    return ", ".join(words)


# -- F5 ---------------------------------------------------------------------------------------------------
async def test_questions_the_runbooks_answer_are_answered_from_them(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await _runbooks(c)
        cases = [
            ("how many days of backups are kept?", "> The nightly backup runs at 02:30 UTC on host bk-3.internal and keeps 14 days"),
            ("how long are backups kept?", "> The nightly backup runs at 02:30 UTC on host bk-3.internal and keeps 14 days"),
            ("what port does the production database use?", "> The production primary database is db-7.internal on port 5432."),
            ("Who do I escalate to?", "> Escalate to the SRE lead Alice Wong"),
            ("who is the SRE lead?", "> Escalate to the SRE lead Alice Wong"),
        ]
        for question, quoted in cases:
            route, content, tools, _ = await _ask(c, question)
            assert route["route"] == "knowledge" and route["method"] == "strong_match", (question, route)
            assert content.startswith("From your documents:") and quoted in content, (question, content)
            assert "found nothing" not in content and tools == ["search_knowledge"], question

        route, content, tools, _ = await _ask(c, "what does the runbook say to do when swap is high?")
        assert route["method"] == "keyword" and tools == ["search_knowledge"]      # no memory reading
        assert route["query"] == "to do when swap is high?"
        assert "> If swap usage is above 50% for 15 minutes, restart the worker pool" in content
        assert "found nothing" not in content and "[oncall.md §On-call runbook > Memory" in content

        route, content, _, _ = await _ask(c, "What is the port of the staging cache?")   # a noun no passage holds
        assert route["method"] == "missing_term"
        assert content == "I found nothing about “cache” in your documents."
        await c.close()


# -- F6 ---------------------------------------------------------------------------------------------------
async def test_a_reading_asked_against_the_runbook_is_read_quoted_and_compared(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await _runbooks(c)
        route, content, tools, calls = await _ask(c, "is the disk above the threshold in the runbook?")
        assert route["route"] == "knowledge" and route["readings"] == ["disk"]
        assert tools == ["search_knowledge", "sys_monitor"] and calls[1]["arguments"] == {"metric": "disk"}
        assert "> The disk usage alert fires when any filesystem is above 85% for 10 minutes." in content
        assert "[oncall.md" not in content                     # the memory passage is not about the disk
        assert "Disk usage:" in content                        # the reading itself
        fss = orjson.loads(calls[1]["result"])["disk"]["filesystems"]
        assert fss
        compared = "; ".join(f"{fs['mount']} is at {fs['percent']:g}%: {_relation(fs['percent'], [85, 95])}" for fs in fss)
        assert content.endswith(f"Compared with the text quoted: {compared}."), content

        route, content, tools, calls = await _ask(c, "is swap usage above the limit in the runbook?")
        assert route["readings"] == ["memory"] and tools == ["search_knowledge", "sys_monitor"]
        assert "> If swap usage is above 50% for 15 minutes" in content and "Memory:" in content
        swap = orjson.loads(calls[1]["result"])["memory"]["swap"]
        if swap["total"] == "0 B":
            assert content.endswith("No comparison was made for swap: this machine has none.")
        else:
            assert content.endswith(f"Compared with the text quoted: swap is at {swap['percent']:g}%: "
                                    f"{_relation(swap['percent'], [50])}.")

        # a reading the documents say nothing about: no disk or memory passage quoted for it, the reading given
        route, content, tools, _ = await _ask(c, "is the CPU above the alert threshold?")
        assert route["method"] == "reading_and_documents" and tools == ["search_knowledge", "sys_monitor"]
        assert content.startswith("I found nothing about “CPU” in your documents.\n\nCPU usage:"), content
        assert content.endswith("No comparison was made: nothing was quoted from your documents.")

        route, content, tools, _ = await _ask(c, "is disk usage above 85%?")   # no setting, no documents: the reading
        assert route["method"] == "intent" and tools == ["sys_monitor"] and "From your documents" not in content
        await c.close()


async def test_a_chinese_reading_asked_against_the_alert_threshold(tmp_path):
    async with wired_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        await raw_upload(c, "磁盘手册.md", ZH_RUNBOOK)
        route, content, tools, calls = await _ask(c, "磁盘使用率超过告警阈值了吗？")
        assert route["method"] == "reading_and_documents" and route["readings"] == ["disk"]
        assert tools == ["search_knowledge", "sys_monitor"]
        assert content.startswith("知识库中的相关内容：") and "> 磁盘使用率超过 80% 时触发告警。" in content
        fss = orjson.loads(calls[1]["result"])["disk"]["filesystems"]
        first = fss[0]
        word = "高于" if first["percent"] > 80 else "等于" if first["percent"] == 80 else "低于"
        assert f"{first['mount']} 当前 {first['percent']:g}%，{word} 80%" in content, content

        route, content, tools, _ = await _ask(c, "目前磁盘使用率超过多少会触发告警")   # asks the value: documents only
        assert route["route"] == "knowledge" and tools == ["search_knowledge"]
        assert "80%" in content
        await c.close()

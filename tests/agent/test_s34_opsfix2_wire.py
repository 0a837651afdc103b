"""Session 34, fixer "opsD" (brief RB2) over a real server (loopback, the production wiring, the v3 client):
a message of several requests answers each (the cases one by one: test_s34_opsfix2_intents.py)."""
from __future__ import annotations

from kb_wire.kbwire import chat, connect, wired_server
from server.agent import answers

APP_LOG = "".join(f"2026-11-27 10:{i:02d}:00 {'ERROR' if i % 3 == 0 else 'INFO'} request {i} done\n" for i in range(30))


def _tools(end) -> list[tuple[str, dict]]:
    return [(t["tool_name"], t["arguments"]) for t in end["message"]["tool_calls"]]


async def test_over_tcp_every_clause_is_answered(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_text(APP_LOG)
    (logs / "d").mkdir()
    for n in range(3):
        (logs / "d" / f"f{n}.txt").write_text("x\n")
    async with wired_server(tmp_path, tools={"log_roots": [str(logs)], "file_roots": [str(logs)],
                                             "allowed_hosts": ["localhost", "127.0.0.1"]}) as (_, addr):
        c = await connect(addr, "alice")
        end, _ = await chat(c, "check port 80 on a and 443 on b")          # (before: localhost:80 only)
        assert _tools(end) == [("network_check", {"host": "a", "port": 80}), ("network_check", {"host": "b", "port": 443})]
        end, _ = await chat(c, "show disk usage and help")                   # (before: the disk only)
        text = end["message"]["content"]
        assert text.startswith("Disk usage:") and answers.help_text(False).splitlines()[0] in text
        end, _ = await chat(c, "show memory and forget everything")          # (before: the memory only, no note)
        text = end["message"]["content"]
        assert [t for t, _ in _tools(end)] == ["sys_monitor"]
        assert text.endswith(answers.forget_apart("forget everything", False))
        end, _ = await chat(c, "show memory and remember that the staging server is stage-7.internal")
        text = end["message"]["content"]                                     # (before: read_file stage-7.internal)
        assert [t for t, _ in _tools(end)] == ["sys_monitor"]
        assert text.endswith("Noted:\n- The staging server is stage-7.internal")
        end, _ = await chat(c, "看下 app.log 最后10行，然后搜索 ERROR")          # (before: the search dropped)
        assert [t for t, _ in _tools(end)] == ["read_log", "search_files"]
        assert f"{APP_LOG.count('ERROR')} 行" in end["message"]["content"] or \
            str(APP_LOG.count("ERROR")) in end["message"]["content"]
        end, _ = await chat(c, "查看磁盘然后重启 nginx")                       # (before: the disk only, no note)
        assert [t for t, _ in _tools(end)] == ["sys_monitor"]
        assert end["message"]["content"].endswith("未执行：“重启 nginx”：离线助手的工具都是只读的。")
        end, _ = await chat(c, "统计 d 下有多少个文件")                         # (before: a grep for 文件)
        assert [(t, a["path"]) for t, a in _tools(end)] == [("list_dir", "d")] and "f2.txt" in end["message"]["content"]
        await c.close()

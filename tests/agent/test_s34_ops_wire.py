"""Session 34, the offline agent's English operator intents over a real server (loopback, the production
wiring, the v3 client): what an on-call engineer asked and how it was answered before (fixer "opsA"; the
cases one by one are in test_s34_ops_intents.py).
"""
from __future__ import annotations

from kb_wire.kbwire import chat, connect, wired_server
from server.agent import answers

APP_LOG = "".join(f"2026-11-27 10:{i:02d}:00 {'ERROR' if i % 3 == 0 else 'INFO'} request {i} done\n" for i in range(30))
ACCESS_LOG = "".join(f'127.0.0.1 - - "GET /x/{i} HTTP/1.1" {502 if i % 4 == 0 else 200} 12\n' for i in range(24))


def _tree(tmp_path):
    logs = tmp_path / "logs"
    (logs / "app").mkdir(parents=True)
    (logs / "app" / "app.log").write_text(APP_LOG)
    (logs / "nginx").mkdir()
    (logs / "nginx" / "access.log").write_text(ACCESS_LOG)
    (logs / "nginx" / "error.log").write_text("2026-11-27 upstream timed out\n")
    (logs / "syslog").write_text("Nov 27 10:00:01 host CRON[1]: job ran\n")
    return logs


def _tools(end) -> list[str]:
    return [t["tool_name"] for t in end["message"]["tool_calls"]]


async def test_over_tcp_counts_grep_options_and_several_requests(tmp_path):
    logs = _tree(tmp_path)
    async with wired_server(tmp_path, tools={"log_roots": [str(logs)], "file_roots": [str(logs)]}) as (srv, addr):
        c = await connect(addr, "alice")
        end, _ = await chat(c, "how many ERROR lines in app/app.log?")      # (before: the last 50 lines)
        assert _tools(end) == ["search_files"]
        assert end["message"]["content"].startswith(f"{APP_LOG.count('ERROR')} line(s) matching 'ERROR'")
        end, _ = await chat(c, "grep -c 502 nginx/access.log")               # (before: "No line matching '-c 502'")
        assert end["message"]["content"].startswith(f"{ACCESS_LOG.count(' 502 ')} line(s) matching '502'")
        end, _ = await chat(c, "grep -v INFO app/app.log")                   # (before: "No line matching '-v INFO'")
        assert _tools(end) == [] and end["message"]["content"] == answers.unsupported_option("-v", False)
        end, _ = await chat(c, "show disk usage and the last 3 lines of app/app.log")    # (before: only the log)
        assert _tools(end) == ["sys_monitor", "read_log"]
        assert end["message"]["content"].startswith("Disk usage:") and "request 29 done" in end["message"]["content"]
        end, _ = await chat(c, "tail nginx/error.log and nginx/access.log")  # (before: only the first)
        assert _tools(end) == ["read_log", "read_log"]
        assert "upstream timed out" in end["message"]["content"] and "GET /x/23" in end["message"]["content"]
        end, _ = await chat(c, "tail syslog")                                # (before: cannot handle)
        assert _tools(end) == ["read_log"] and "CRON[1]: job ran" in end["message"]["content"]
        await c.close()


async def test_over_tcp_refusals_services_the_past_and_pronouns(tmp_path):
    logs = _tree(tmp_path)
    async with wired_server(tmp_path, tools={"log_roots": [str(logs)], "file_roots": [str(logs)]}) as (srv, addr):
        c = await connect(addr, "alice")
        for text in ("kill -9 1234", 'execute "rm -rf /"', "run 'reboot'"):   # (before: cannot handle)
            end, _ = await chat(c, text)
            assert end["message"]["content"] == answers.refusal(False) and not end["message"]["tool_calls"], text
        end, _ = await chat(c, "what's the status of nginx?")               # (before: the system overview)
        assert _tools(end) == ["processes"]
        assert end["message"]["tool_calls"][0]["arguments"]["name"] == "nginx"
        assert end["message"]["content"].startswith("Services are not checked")
        end, _ = await chat(c, "what was the CPU usage yesterday?")          # (before: the reading, no word)
        assert end["message"]["content"].startswith("I only see the machine now")
        end, _ = await chat(c, "top three processes by memory")             # (before: a filter on "three")
        [call] = end["message"]["tool_calls"]
        assert call["arguments"]["limit"] == 3 and "name" not in call["arguments"]
        end, _ = await chat(c, "now grep ERROR in it")                        # (before: a file named "it")
        assert _tools(end) == [] and end["message"]["content"].startswith("Which file should I search for 'ERROR'?")
        await c.close()

"""Session 34, the offline agent's English operator intents (fixer "opsA"), as an English-speaking on-call
engineer asks them. Each case failed before:

1. counts and grep flags: "how many ERROR lines in app/app.log?", "count 502 in nginx/access.log" showed the
   last 50 lines; "grep -c 502 F", "grep -v INFO F" searched for the text "-c 502" / "-v INFO";
2. number words and non-names: "top three processes" filtered by the name "three", "how many processes are
   running?" by "many", "what is process 1" by "is"; "last five lines" gave 50; a PID or a user was ignored;
3. several requests in one message answered one: "show disk usage and the last 3 lines of app.log" (only the
   log), "is port 22 or N open" (only 22), "tail A and B" (only A);
4. past and time-range questions got a live reading without a word ("what was the CPU usage yesterday?");
   "errors in the last hour in app.log" showed the last 50 lines of every level;
7. refusals missed "kill -9 1234", 'execute "rm -rf /"', "run 'reboot'"; "what's the status of nginx?" got
   the system overview;
8. "is the server healthy?" was not understood; the memory answer had no verdict; "bandwidth usage", "cpu
   temperature", "free memory in GB" did not say what is not measured or which unit is shown;
9. "sort them by memory" answered the system memory; "now grep ERROR in it" looked for a file named "it";
10. "tail syslog", "when was the last reboot?", "what's mounted?", "how many cores?", typos ("memroy",
    "dsik"); the process header "(137 matched of 141)" read as filtered; the help text was static.
"""
from __future__ import annotations

import os

import pytest

from server.agent import answers
from server.agent.config import AgentConfig
from server.agent.file_intents import counts_in_digits, parse_file_request
from server.agent.intents import parse
from server.agent.typos import corrected
from server.agent.offline import OfflineAgent
from server.tools import ToolRegistry, ToolsConfig

from .conftest import RecordingSink, make_request

APP_LOG = "".join(f"2026-11-27 10:{i:02d}:00 {'ERROR' if i % 3 == 0 else 'INFO'} request {i} done\n" for i in range(30))
ACCESS_LOG = "".join(f'127.0.0.1 - - "GET /x/{i} HTTP/1.1" {502 if i % 4 == 0 else 200} 12\n' for i in range(24))
ERRORS = APP_LOG.count("ERROR")          # 10
BAD_GATEWAYS = ACCESS_LOG.count('" 502 ')  # 6


def calls(text: str, messages=None) -> list[tuple[str | None, dict]]:
    return [(i.tool, i.arguments) for i in parse(text, messages)]


def notes(text: str) -> list[str]:
    return [key for i in parse(text) for key, _ in i.notes]


@pytest.fixture
def logs(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "app.log").write_text(APP_LOG)
    (tmp_path / "nginx").mkdir()
    (tmp_path / "nginx" / "access.log").write_text(ACCESS_LOG)
    (tmp_path / "nginx" / "error.log").write_text("2026-11-27 upstream timed out\n")
    (tmp_path / "syslog").write_text("Nov 27 10:00:01 host CRON[1]: job ran\n")
    return tmp_path


@pytest.fixture
def agent(logs) -> OfflineAgent:
    return OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(cpu_sample_s=0.05, log_roots=[str(logs)],
                                                                file_roots=[str(logs)])))


async def ask(agent: OfflineAgent, text: str, context=None):
    sink = RecordingSink()
    result = await agent.run_turn(make_request(text, context=context, model="offline"), sink)
    assert sink.text == result.content
    return result.content, [(c.tool_name, c.arguments) for c in result.tool_calls]


# -- 1. English counts and grep options --------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("how many ERROR lines in app/app.log?", {"root": "app/app.log", "pattern": "ERROR"}),
    ("count 502 in nginx/access.log", {"root": "nginx/access.log", "pattern": "502"}),
    ("how many 502s in nginx/access.log?", {"root": "nginx/access.log", "pattern": "502"}),
    ("how many errors in app/app.log", {"root": "app/app.log", "pattern": "error", "ignore_case": True}),
    ("how many lines in app/app.log contain ERROR", {"root": "app/app.log", "pattern": "ERROR"}),
    ("how many times does timeout appear in nginx/error.log?", {"root": "nginx/error.log", "pattern": "timeout"}),
    ("number of 502 in nginx/access.log", {"root": "nginx/access.log", "pattern": "502"}),
    ("grep -c 502 nginx/access.log", {"root": "nginx/access.log", "pattern": "502"}),
    ("grep --count 502 nginx/access.log", {"root": "nginx/access.log", "pattern": "502"}),
    ("grep -ci error app/app.log", {"root": "app/app.log", "pattern": "error", "ignore_case": True}),
    ("grep -n ERROR app/app.log", {"root": "app/app.log", "pattern": "ERROR"}),
    ("grep -E 'ERR(OR)?' app/app.log", {"root": "app/app.log", "pattern": "ERR(OR)?", "regex": True}),
    ("grep -w -i error app/app.log", {"root": "app/app.log", "pattern": r"\berror\b", "regex": True,
                                      "ignore_case": True}),
    ("grep -i error /var/log/syslog", {"root": "/var/log/syslog", "pattern": "error", "ignore_case": True}),
])
def test_english_counts_and_grep_options_are_searches(text, expected):
    assert calls(text) == [("search_files", expected)]


@pytest.mark.parametrize("text, option", [("grep -v INFO app/app.log", "-v"), ("grep -A 3 ERROR app/app.log", "-A"),
                                          ("grep --invert-match INFO app.log", "--invert-match"),
                                          ("grep -o ERR app.log", "-o"), ("grep -5 ERROR app.log", "-5")])
def test_a_grep_option_the_search_cannot_honour_is_refused_by_name(text, option):
    assert calls(text) == [(None, {"option": option})]
    said = answers.without_tool(parse(text), False)
    assert said.startswith(f"grep option {option}") and "is not supported" in said


def test_no_count_of_what_is_no_file_or_no_text():
    assert parse_file_request("how many cores in total") is None
    assert parse_file_request("how many lines in app.log") is None
    assert calls("access.log 里有几个 502") == [("search_files", {"root": "access.log", "pattern": "502"})]   # (as before)


async def test_counts_and_options_through_the_offline_agent(agent):
    answer, tools = await ask(agent, "how many ERROR lines in app/app.log?")
    assert [(t, a["root"], a["pattern"]) for t, a in tools] == [("search_files", "app/app.log", "ERROR")]
    assert answer.startswith(f"{ERRORS} line(s) matching 'ERROR'")
    answer, tools = await ask(agent, "grep -c 502 nginx/access.log")
    assert answer.startswith(f"{BAD_GATEWAYS} line(s) matching '502'")
    answer, tools = await ask(agent, "grep -v INFO app/app.log")
    assert tools == [] and answer.startswith("grep option -v (lines NOT matching) is not supported")


# -- 2. number words, non-names, a PID, a user ------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("top three processes by memory", {"sort_by": "memory", "limit": 3}),
    ("top twenty processes", {"sort_by": "cpu", "limit": 20}),
    ("show the five biggest processes", {"sort_by": "cpu", "limit": 5}),
    ("how many processes are running?", {"sort_by": "cpu"}),
    ("which processes are using the most memory", {"sort_by": "memory"}),
    ("top 5 processes named python", {"sort_by": "cpu", "limit": 5, "name": "python"}),
    ("any python processes?", {"sort_by": "cpu", "name": "python"}),
])
def test_number_words_count_and_question_words_are_no_names(text, expected):
    assert calls(text) == [("processes", expected)]


def test_english_number_words_in_count_positions_only():
    assert counts_in_digits("show the last five lines of app.log") == "show the last 5 lines of app.log"
    assert counts_in_digits("last twenty-five lines") == "last 25 lines"
    assert counts_in_digits("a hundred lines of x.log") == "100 lines of x.log"
    assert counts_in_digits("which one is it") == "which one is it"
    assert counts_in_digits('grep "three lines" in a.log') == 'grep "three lines" in a.log'
    assert calls("show the last five lines of app/app.log") == [("read_log", {"path": "app/app.log", "lines": 5})]


def test_a_pid_and_a_user_asked_are_said_not_dropped():
    for text in ("what is process 1", "show process 1", "show pid 1"):
        [intent] = parse(text)
        assert intent.tool == "processes" and "name" not in intent.arguments and intent.arguments["limit"] == 50
        assert intent.notes == [("pid_asked", {"pid": 1})]
    listing = "Top 2 processes by CPU (9 in all):\n1. init (pid 1, root): CPU 0%\n2. sh (pid 7, bob): CPU 0%"
    assert answers.with_notes(listing, parse("what is process 1"), False).startswith(
        "PID 1 is in the list: 1. init (pid 1, root): CPU 0%\n")
    assert answers.with_notes(listing, parse("what is process 4242"), False).startswith(
        "PID 4242 is not among the processes listed: the processes tool cannot look up one PID")
    [intent] = parse("processes of user root")
    assert intent.arguments == {"sort_by": "cpu"} and intent.notes == [("user_filter", {"user": "root"})]


async def test_a_pid_through_the_offline_agent(agent):
    answer, tools = await ask(agent, "what is process 4194304")     # (above Linux's largest pid)
    assert tools == [("processes", {"sort_by": "cpu", "limit": 50})] or tools[0][1]["limit"] == 50
    assert answer.startswith("PID 4194304 is not among the processes listed")


# -- 3. several requests in one message -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("show disk usage and the last 3 lines of app/app.log",
     [("sys_monitor", {"metric": "disk"}), ("read_log", {"path": "app/app.log", "lines": 3})]),
    ("check port 8080 on localhost and show memory",
     [("network_check", {"host": "localhost", "port": 8080}), ("sys_monitor", {"metric": "memory"})]),
    ("is port 22 or 8080 open on localhost?",
     [("network_check", {"host": "localhost", "port": 22}), ("network_check", {"host": "localhost", "port": 8080})]),
    ("check ports 80, 443 and 8443", [("network_check", {"host": "localhost", "port": p}) for p in (80, 443, 8443)]),
    ("tail nginx/error.log and grep 502 in nginx/access.log",
     [("read_log", {"path": "nginx/error.log"}), ("search_files", {"root": "nginx/access.log", "pattern": "502"})]),
    ("tail nginx/error.log and nginx/access.log",
     [("read_log", {"path": "nginx/error.log"}), ("read_log", {"path": "nginx/access.log"})]),
    ("top processes by memory; tail syslog", [("processes", {"sort_by": "memory"}), ("read_log", {"path": "syslog"})]),
    ("check port 22 on localhost and port 80 on 10.0.0.1",
     [("network_check", {"host": "localhost", "port": 22}), ("network_check", {"host": "10.0.0.1", "port": 80})]),
    ("cat a.conf and b.conf", [("read_file", {"path": "a.conf"}), ("read_file", {"path": "b.conf"})]),
    ("tail app.log, please", [("read_log", {"path": "app.log"})]),
    ("查看磁盘以及 app.log 最后 3 行", [("sys_monitor", {"metric": "disk"}), ("read_log", {"path": "app.log", "lines": 3})]),
    # (unchanged: one request whose words say "and")
    ("show CPU and memory", [("sys_monitor", {"metric": "cpu"}), ("sys_monitor", {"metric": "memory"})]),
    ("Which processes use the most CPU and memory?", [("processes", {"sort_by": "memory"})]),
    ("grep ERROR and WARN in app.log", [("search_files", {"root": "app.log", "pattern": "ERROR and WARN"})]),
    ("grep 'a and b' in app.log", [("search_files", {"root": "app.log", "pattern": "a and b"})]),
])
def test_each_request_of_a_message_is_answered(text, expected):
    assert calls(text) == expected


def test_a_part_not_understood_or_refused_is_named():
    assert notes("tail app.log and tell me why it fails") == ["part_not_answered"]
    assert answers.with_notes("LOG", parse("tail app.log and tell me why it fails"), False) == \
        'LOG\nNot answered: "tell me why it fails" (the offline assistant did not understand that part).'
    assert notes("show memory and kill nginx") == ["part_refused"]


async def test_several_requests_through_the_offline_agent(agent):
    answer, tools = await ask(agent, "show disk usage and the last 3 lines of app/app.log")
    assert [t for t, _ in tools] == ["sys_monitor", "read_log"]
    assert answer.startswith("Disk usage:") and "Last 3 lines of " in answer and "request 29 done" in answer


# -- 4. the past and time ranges ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["what was the CPU usage yesterday?", "was memory high last night?",
                                  "how busy was the disk 2 hours ago", "昨天CPU高吗"])
def test_a_reading_asked_of_the_past_says_it_is_the_current_one(text):
    assert "past_reading" in notes(text)


def test_a_reading_asked_now_has_no_past_note():
    for text in ("CPU usage", "how much memory is free", "查看CPU使用率", "show disk usage"):
        assert notes(text) == []


def test_a_log_level_and_a_time_range_asked_of_a_log():
    [intent] = parse("errors in the last hour in app/app.log")
    assert (intent.tool, intent.arguments) == ("search_files", {"root": "app/app.log", "pattern": "error",
                                                                "ignore_case": True})
    assert [k for k, _ in intent.notes] == ["level_filter", "log_time_range"]
    assert calls("show warnings and errors in app/app.log") == \
        [("search_files", {"root": "app/app.log", "pattern": "warn|error", "ignore_case": True, "regex": True})]
    assert calls("tail nginx/error.log") == [("read_log", {"path": "nginx/error.log"})]    # (a path, no level)
    assert calls("show the nginx error log") == [("read_log", {"path": "nginx/error.log"})]
    [intent] = parse("last hour of app/app.log")
    assert intent.tool == "read_log" and [k for k, _ in intent.notes] == ["log_time_range"]


async def test_the_past_through_the_offline_agent(agent):
    answer, tools = await ask(agent, "what was the CPU usage yesterday?")
    assert [t for t, _ in tools] == ["sys_monitor"]
    assert answer.startswith("I only see the machine now: no past readings are kept, so this is the current "
                             "reading:\nCPU usage: ")
    answer, tools = await ask(agent, "errors in the last hour in app/app.log")
    assert answer.startswith("Lines with error (any case), from the start of the log:\nThe time range (in the last "
                             "hour) was not applied") and f"{ERRORS} line(s) matching 'error'" in answer
    assert "INFO" not in answer


# -- 7. refusals ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["kill -9 1234", 'execute "rm -rf /"', "run 'reboot'", "run `reboot`",
                                  "execute 'systemctl status nginx'", "kill -15 1234", "pkill -9 nginx"])
def test_numeric_flags_and_quoted_commands_are_objects_of_a_refused_verb(text):
    assert [i.name for i in parse(text)] == ["refuse"]


@pytest.mark.parametrize("text, service", [("what's the status of nginx?", "nginx"), ("nginx status", "nginx"),
                                           ("is postgres running?", "postgres"), ("systemctl status nginx", "nginx"),
                                           ("status of the redis service", "redis")])
def test_a_service_status_lists_its_processes_and_says_services_are_not_checked(text, service):
    [intent] = parse(text)
    assert (intent.name, intent.tool, intent.arguments) == ("processes", "processes",
                                                            {"sort_by": "cpu", "name": service})
    assert intent.notes == [("service_not_checked", {"service": service})]


@pytest.mark.parametrize("text", ["status", "system status", "what's the status of the server?", "server status"])
def test_the_machine_s_status_is_still_the_overview(text):
    assert calls(text) == [("sys_monitor", {"metric": "all"})]


# -- 8. verdicts and notes -----------------------------------------------------------------------------------------
def test_health_of_the_server_is_the_overview():
    assert calls("is the server healthy?") == [("sys_monitor", {"metric": "all"})]
    assert calls("is memory usage healthy?") == [("sys_monitor", {"metric": "memory"})]


def _memory(percent: float, swap: float = 0.0) -> dict:
    return {"total": "16.0 GiB", "available": "8.0 GiB", "used": "8.0 GiB", "percent": percent,
            "swap": {"total": "2.0 GiB" if swap else "0 B", "used": "1.0 GiB", "percent": swap}}


def test_the_memory_answer_has_a_verdict_at_a_named_threshold():
    high = answers.MEMORY_HIGH_PERCENT
    assert answers._memory(_memory(high + 1), False).endswith(f"High: {high + 1}% used ({high}% or more).")
    assert answers._memory(_memory(11.9), False).endswith(f"Normal: 11.9% used (under {high}%).")
    assert answers._memory(_memory(11.9, swap=80.0), False).endswith(
        f"Swap is 80.0% used ({answers.SWAP_HIGH_PERCENT}% or more).")
    assert answers._memory(_memory(95.0), True).endswith(f"内存偏高：已用 95.0%（不低于 {high}%）。")


def test_what_is_not_measured_is_said_and_decimal_units_are_given():
    assert notes("bandwidth usage") == ["no_rate"]
    assert notes("cpu temperature") == ["no_temperature"]
    assert notes("how much memory is free in GB?") == ["decimal_units"]
    said = answers.with_notes("Memory: 2.0 GiB used of 16.0 GiB (12.5%), 512.0 MiB available.",
                              parse("how much memory is free in GB?"), False)
    assert said.endswith("Memory: 2.0 GiB (2.1 GB) used of 16.0 GiB (17.2 GB) (12.5%), 512.0 MiB (0.5 GB) available.")


async def test_notes_through_the_offline_agent(agent):
    answer, _ = await ask(agent, "bandwidth usage")
    assert answer.startswith("No rate (bytes per second) is measured: these are totals since boot.\nNetwork since boot")
    answer, _ = await ask(agent, "cpu temperature")
    assert answer.startswith("CPU temperature is not read by the offline tools; CPU usage is:\nCPU usage: ")
    answer, _ = await ask(agent, "is memory usage healthy?")
    assert " Normal: " in answer or " High: " in answer
    answer, tools = await ask(agent, "is the server healthy?")
    assert [t for t, _ in tools] == ["sys_monitor"] and answer.startswith("System overview:")


# -- 9. follow-ups ---------------------------------------------------------------------------------------------------
def _turns(*said: str) -> list[dict]:
    out = [{"role": "system", "content": "sys"}]
    for i, text in enumerate(said):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return out


def test_a_pronoun_is_never_a_path():
    assert calls("now grep ERROR in it") == [(None, {"pattern": "ERROR"})]
    assert answers.without_tool(parse("now grep ERROR in it"), False).startswith("Which file should I search for 'ERROR'?")
    context = _turns("show the last 3 lines of app/app.log", "Last 3 lines of ...", "now grep ERROR in it")
    assert calls("now grep ERROR in it", context) == [("search_files", {"root": "app/app.log", "pattern": "ERROR"})]
    context = _turns("tail nginx/error.log", "Last 1 lines ...", "grep timeout in that file")
    assert calls("grep timeout in that file", context) == \
        [("search_files", {"root": "nginx/error.log", "pattern": "timeout"})]


def test_a_re_sort_follows_the_previous_listing():
    assert calls("sort them by memory") == [("processes", {"sort_by": "memory"})]
    context = _turns("top 5 processes named python", "Top 5 ...", "sort them by memory")
    assert calls("sort them by memory", context) == [("processes", {"sort_by": "memory", "limit": 5, "name": "python"})]


async def test_follow_ups_through_the_offline_agent(agent):
    answer, tools = await ask(agent, "now grep ERROR in it")
    assert tools == [] and answer.startswith("Which file should I search for 'ERROR'?")
    answer, tools = await ask(agent, "sort them by memory")
    assert [(t, a["sort_by"]) for t, a in tools] == [("processes", "memory")]
    assert answer.startswith("Top ") and " processes by memory (" in answer


# -- 10. small gaps ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("tail syslog", [("read_log", {"path": "syslog"})]),
    ("tail -n 20 syslog", [("read_log", {"path": "syslog", "lines": 20})]),
    ("show me the syslog", [("read_log", {"path": "syslog"})]),
    ("when was the last reboot?", [("sys_monitor", {"metric": "uptime"})]),
    ("when was the server restarted?", [("sys_monitor", {"metric": "uptime"})]),
    ("what's mounted?", [("sys_monitor", {"metric": "disk"})]),
    ("how many cores?", [("sys_monitor", {"metric": "cpu"})]),
    ("whats the memroy usage", [("sys_monitor", {"metric": "memory"})]),
    ("dsik usage", [("sys_monitor", {"metric": "disk"})]),
    ("show netwrok", [("sys_monitor", {"metric": "network"})]),
    ("what's the risk?", []),                         # (one letter from "disk": a real word stays)
])
def test_small_gaps(text, expected):
    assert calls(text) == expected


def test_typos_are_corrected_only_in_words_of_four_letters_or_more_and_never_in_paths():
    assert corrected("memroy and dsik") == "memory and disk"
    assert corrected("cat /srv/memroy.log") == "cat /srv/memroy.log"
    assert corrected("risk desk lead") == "risk desk lead"


def test_the_process_header_says_what_was_not_read_without_a_filter():
    d = {"sort_by": "cpu", "total_processes": 141, "matched": 137,
         "processes": [{"pid": 1, "name": "init", "user": "root", "cpu_percent": 0.0, "rss": "1 MiB",
                        "memory_percent": 0.1}]}
    assert answers._processes(d, False).startswith("Top 1 processes by CPU (137 of 141; 4 vanished or unreadable):")
    assert answers._processes({**d, "matched": 141}, False).startswith("Top 1 processes by CPU (141 in all):")
    assert answers._processes({**d, "name_filter": "init"}, False).startswith(
        "Top 1 processes by CPU (137 matched of 141):")
    assert answers._processes(d, True).startswith("按 CPU 排序的前 1 个进程（共 141 个）")     # (Chinese as before)


def test_the_help_text_is_built_from_the_configured_roots():
    said = answers.help_text(False, (["/srv/logs"], ["/srv/files"]))
    assert "the end of a log file under /srv/logs (\"tail <name>\"" in said
    assert "files under /srv/files, /srv/logs: list a directory" in said
    assert "once the server sets" not in said and "/var/log/syslog" not in said
    said = answers.help_text(False, ([], []))
    assert "log files: not enabled on this server; its [tools] log_roots is empty" in said
    assert "/var/log/syslog" not in answers.help_text(False) and "[tools] log_roots" in answers.help_text(False)
    assert "/srv/logs" in answers.help_text(True, (["/srv/logs"], []))
    assert answers.without_tool(parse("help"), False, (["/srv/logs"], [])) == answers.help_text(False, (["/srv/logs"], []))


def test_the_pid_of_this_process_is_found_when_listed():
    listing = f"Top 1 processes by CPU (5 in all):\n1. python (pid {os.getpid()}, me): CPU 1.0%"
    assert answers.with_notes(listing, parse(f"show pid {os.getpid()}"), True).startswith(f"PID {os.getpid()} 在列表中")


async def test_a_level_filter_without_file_roots_says_what_still_works(logs):
    agent = OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(cpu_sample_s=0.05, log_roots=[str(logs)])))
    answer, tools = await ask(agent, "errors in app/app.log")
    assert [t for t, _ in tools] == ["search_files"]
    assert answer.endswith("(Counting or filtering lines of a log uses the file search, which needs [tools] file_roots; "
                           "\"tail <log>\" shows a log's last lines from [tools] log_roots.)")

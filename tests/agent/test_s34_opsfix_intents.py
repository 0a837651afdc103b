"""Session 34, regressions of the day's offline English intents (fixer "opsC", brief RB). Each case failed on the
code of commit ca7ca49:

2. a request of a multi-request message that needs no tool was dropped: "show disk usage and tail the error log"
   answered the disk only (no "Which log file?"), "show memory and grep -v INFO app/app.log" lost the -v refusal;
   "in it" in the same message did not name the earlier clause's file;
4. a misspelled metric word before "status" was a service ("memroy status" -> "No running process matches");
5. typo correction turned English into readings ("Is Emory University in Atlanta?" -> memory, "the stowage plan"
   -> disk, "show me how the reindex progresses" -> processes);
6. "count the files in DIR" grepped for the word "files";
7. "grep timeout in nginx/error.log and explain it" asked "Which file should I search for 'timeout in ...'?";
8. "is nginx up and postgres down?" checked nginx only;
9. "check port 22 on a and port 80 on b" checked localhost:22.
"""
from __future__ import annotations

import pytest

from kb_wire.kbwire import chat, connect, wired_server
from server.agent import answers
from server.agent.config import AgentConfig
from server.agent.intents import parse
from server.agent.typos import corrected
from server.agent.offline import OfflineAgent
from server.tools import ToolRegistry, ToolsConfig

from .conftest import RecordingSink, make_request

APP_LOG = "".join(f"2026-11-27 10:{i:02d}:00 {'ERROR' if i % 3 == 0 else 'INFO'} request {i} done\n" for i in range(30))
ERRORS = APP_LOG.count("ERROR")          # 10


def calls(text: str) -> list[tuple[str | None, dict]]:
    return [(i.tool, i.arguments) for i in parse(text)]


def notes(text: str) -> list[str]:
    return [key for i in parse(text) for key, _ in i.notes]


def _tree(root):
    (root / "app").mkdir(parents=True)
    (root / "app" / "app.log").write_text(APP_LOG)
    (root / "nginx").mkdir()
    (root / "nginx" / "error.log").write_text("2026-11-27 upstream timed out\n")
    return root


@pytest.fixture
def logs(tmp_path):
    return _tree(tmp_path / "logs")


@pytest.fixture
def agent(logs) -> OfflineAgent:
    return OfflineAgent(AgentConfig(), ToolRegistry(ToolsConfig(cpu_sample_s=0.05, log_roots=[str(logs)],
                                                                file_roots=[str(logs)])))


async def ask(agent: OfflineAgent, text: str):
    sink = RecordingSink()
    result = await agent.run_turn(make_request(text, model="offline"), sink)
    assert sink.text == result.content
    return result.content, [(c.tool_name, c.arguments) for c in result.tool_calls]


# -- 2. every request of a message is answered or named -------------------------------------------------------------
async def test_a_request_without_a_tool_is_answered_after_the_tool_results(agent):
    answer, made = await ask(agent, "show disk usage and tail the error log")
    assert [t for t, _ in made] == ["sys_monitor"]
    assert answer.startswith("Disk usage:") and answer.endswith(answers.log_path_needed(False))
    answer, made = await ask(agent, "show memory and grep -v INFO app/app.log")
    assert [t for t, _ in made] == ["sys_monitor"]
    assert answer.startswith("Memory:") and answer.endswith(answers.unsupported_option("-v", False))


async def test_in_it_names_the_file_of_an_earlier_clause_of_the_same_message(agent):
    assert calls("show the last 10 lines of app/app.log, and grep ERROR in it") == [
        ("read_log", {"path": "app/app.log", "lines": 10}), ("search_files", {"root": "app/app.log", "pattern": "ERROR"})]
    answer, made = await ask(agent, "show the last 10 lines of app/app.log, and grep ERROR in it")
    assert [t for t, _ in made] == ["read_log", "search_files"]
    assert f"{ERRORS} line(s) matching 'ERROR'" in answer and "Which file" not in answer


# -- 4. a misspelled metric word is no service ----------------------------------------------------------------------
@pytest.mark.parametrize("text", ["memroy status", "dsik status", "netwrok status", "netowrk status", "health status",
                                  "system status", "RAM status"])
def test_a_metric_word_or_its_typo_before_status_is_no_service(text):
    assert calls(text) == [("sys_monitor", {"metric": "all"})] and notes(text) == []


def test_a_real_service_status_is_still_a_service():
    assert calls("nginx status") == [("processes", {"sort_by": "cpu", "name": "nginx"})]
    assert notes("is postgres running?") == ["service_not_checked"]


# -- 5. typos are corrected only in what reads as an ops request ----------------------------------------------------
@pytest.mark.parametrize("text", ["Is Emory University in Atlanta?", "what are the statues in the lobby?",
                                  "the stowage plan", "show me how the reindex progresses", "stratus clouds"])
def test_ordinary_english_is_not_corrected_into_a_reading(text):
    assert parse(text) == [] and corrected(text) == text


@pytest.mark.parametrize("text, metric", [("whats the memroy usage", "memory"), ("dsik usage", "disk"),
                                          ("memroy", "memory"), ("how much memroy is free", "memory"),
                                          ("whats the memroy usage on db-1 right now", "memory"),
                                          ("show me the dsik space", "disk"), ("Memroy usage?", "memory")])
def test_a_typo_in_an_ops_request_is_still_corrected(text, metric):
    assert calls(text) == [("sys_monitor", {"metric": metric})]


def test_two_edits_only_when_letters_are_swapped():
    from server.agent.typos import typo_of
    assert typo_of("progresses") is None                  # two edits, other letters: no "processes"
    assert typo_of("bnadwdith") == "bandwidth"            # two swaps
    assert typo_of("Emory") is None and corrected("Emory memroy usage") == "Emory memory usage"


# -- 6. a count of a directory's entries lists it -------------------------------------------------------------------
@pytest.mark.parametrize("text, path", [("count the files in /var/log", "/var/log"),
                                        ("count the directories in /srv/logs", "/srv/logs"),
                                        ("how many files are in nginx?", "nginx")])
def test_counting_files_lists_the_directory(text, path):
    assert calls(text) == [("list_dir", {"path": path})]


async def test_counting_files_over_the_agent_lists_them(agent, logs):
    answer, made = await ask(agent, f"count the files in {logs}")
    assert [(t, a["path"]) for t, a in made] == [("list_dir", str(logs))] and "2 of 2 entries" in answer


# -- 7. a grep clause alone is a full request -----------------------------------------------------------------------
def test_a_grep_clause_followed_by_another_is_read_alone():
    assert calls("grep ERROR in app/app.log and count them") == [
        ("search_files", {"root": "app/app.log", "pattern": "ERROR"})]
    assert notes("grep ERROR in app/app.log and count them") == []          # (the answer says how many)
    assert calls("grep timeout in nginx/error.log and explain it") == [
        ("search_files", {"root": "nginx/error.log", "pattern": "timeout"})]
    assert notes("grep timeout in nginx/error.log and explain it") == ["part_not_explained"]
    assert calls("grep ERROR and WARN in app.log") == [("search_files", {"root": "app.log", "pattern": "ERROR and WARN"})]


async def test_grep_and_explain_answers_the_grep_and_says_it_cannot_explain(agent):
    answer, made = await ask(agent, "grep upstream in nginx/error.log and explain it")
    assert [t for t, _ in made] == ["search_files"] and "upstream timed out" in answer
    assert answer.endswith('Not answered: "explain it": the offline assistant shows and checks, it cannot explain or '
                           "analyze; a configured language model can ([llm] in the server config).")
    answer, made = await ask(agent, "grep ERROR in app/app.log and count them")
    assert [t for t, _ in made] == ["search_files"] and answer.startswith(f"{ERRORS} line(s) matching 'ERROR'")


# -- 8. "is ... up/down" carried over ------------------------------------------------------------------------------
def test_a_name_and_a_state_is_asked_like_the_service_before():
    assert calls("is nginx up and postgres down?") == [("processes", {"sort_by": "cpu", "name": "nginx"}),
                                                       ("processes", {"sort_by": "cpu", "name": "postgres"})]
    assert "part_not_answered" not in notes("is nginx up and postgres down?")


async def test_two_services_share_one_note(agent):
    answer, _ = await ask(agent, "is nginx up and postgres down?")
    assert answer.count("Services are not checked") == 1 and "'nginx', 'postgres'" in answer


# -- 9. a host named "a" at the end of its clause ------------------------------------------------------------------
def test_a_host_named_a_at_a_clause_end_is_a_host():
    assert calls("check port 22 on a and port 80 on b") == [("network_check", {"host": "a", "port": 22}),
                                                           ("network_check", {"host": "b", "port": 80})]
    assert calls("check port 22 on a server") == [("network_check", {"host": "localhost", "port": 22})]


def test_ignoring_case_after_a_comma_is_a_grep_option():
    assert calls("grep error in app/app.log, ignoring case") == [
        ("search_files", {"root": "app/app.log", "pattern": "error", "ignore_case": True})]


# -- over a real server --------------------------------------------------------------------------------------------
def _tools(end) -> list[str]:
    return [t["tool_name"] for t in end["message"]["tool_calls"]]


async def test_over_tcp_every_request_answered(tmp_path):
    logs = _tree(tmp_path / "logs")
    async with wired_server(tmp_path, tools={"log_roots": [str(logs)], "file_roots": [str(logs)]}) as (srv, addr):
        c = await connect(addr, "alice")
        end, _ = await chat(c, "show disk usage and tail the error log")          # (before: the disk only)
        assert _tools(end) == ["sys_monitor"] and end["message"]["content"].endswith(answers.log_path_needed(False))
        end, _ = await chat(c, "memroy status")                                    # (before: a service 'memroy')
        assert _tools(end) == ["sys_monitor"] and "Services are not checked" not in end["message"]["content"]
        end, _ = await chat(c, "Is Emory University in Atlanta?")                  # (before: a memory reading)
        assert _tools(end) == []
        end, _ = await chat(c, "grep ERROR in app/app.log and count them")        # (before: "Which file ...?")
        assert _tools(end) == ["search_files"]
        assert end["message"]["content"].startswith(f"{ERRORS} line(s) matching 'ERROR'")
        end, _ = await chat(c, f"count the files in {logs}")                      # (before: a grep for "files")
        assert _tools(end) == ["list_dir"] and "2 of 2 entries" in end["message"]["content"]
        end, _ = await chat(c, "is nginx up and postgres down?")                   # (before: nginx only)
        assert [t["arguments"]["name"] for t in end["message"]["tool_calls"]] == ["nginx", "postgres"]
        await c.close()

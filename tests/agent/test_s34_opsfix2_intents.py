"""Session 34, fixer "opsD" (brief RB2): multi-clause offline requests -- clauses lost, forget / help / remember
clauses, the Chinese separators (然后, 并且, 并, 再), Chinese counts of files and "<host> 的 <port> 端口". Each
case was answered wrongly before (said in the comment); the same over the wire: test_s34_opsfix2_wire.py."""
from __future__ import annotations

import pytest

from server.agent.intents import parse


def _said(text):
    return [(i.name, i.tool, i.arguments, [k for k, _ in i.notes]) for i in parse(text)]


def test_a_port_and_host_clause_after_a_port_check_is_checked_on_its_own_host():
    # before: only localhost:80 ("a" was a host only at the end of the whole text), "443 on b" dropped silently
    assert _said("check port 80 on a and 443 on b") == [
        ("network_check", "network_check", {"host": "a", "port": 80}, []),
        ("network_check", "network_check", {"host": "b", "port": 443}, [])]


def test_forget_help_and_identity_clauses_are_not_dropped():
    # before: the reading only, the second request dropped silently
    assert _said("show memory and forget everything") == [
        ("memory", "sys_monitor", {"metric": "memory"}, []), ("forget", None, {"part": "forget everything"}, [])]
    assert _said("show disk usage and help") == [("disk", "sys_monitor", {"metric": "disk"}, []), ("help", None, {}, [])]
    assert _said("show cpu and who are you") == [("cpu", "sys_monitor", {"metric": "cpu"}, []), ("help", None, {}, [])]
    # one request is still one ("show CPU and memory")
    assert [i.name for i in parse("show CPU and memory")] == ["cpu", "memory"]


def test_a_clause_to_remember_is_no_file():
    # before: read_file stage-7.internal
    said = _said("show memory and remember that the staging server is stage-7.internal")
    assert said == [("memory", "sys_monitor", {"metric": "memory"}, []),
                    ("note", None, {"part": "remember that the staging server is stage-7.internal"}, [])]


def test_chinese_separators_join_requests():
    # before: the disk only, no refusal note
    assert _said("查看磁盘然后重启 nginx") == [("disk", "sys_monitor", {"metric": "disk"}, ["part_refused"])]
    # before: the search dropped
    assert _said("看下 app.log 最后10行，然后搜索 ERROR") == [
        ("read_log", "read_log", {"path": "app.log", "lines": 10}, []),
        ("search_files", "search_files", {"root": "app.log", "pattern": "ERROR"}, [])]
    # before: the pattern 'ERROR 并统计'
    assert _said("在 app.log 中搜索 ERROR 并统计") == [
        ("search_files", "search_files", {"root": "app.log", "pattern": "ERROR"}, [])]
    # 并 / 再 inside words join nothing
    assert _said("在 app.log 中搜索 并发") == [("search_files", "search_files", {"root": "app.log", "pattern": "并发"}, [])]
    assert _said("在 app.log 中搜索 再次") == [("search_files", "search_files", {"root": "app.log", "pattern": "再次"}, [])]


def test_chinese_counts_of_files_and_host_ports():
    # before: a search for 文件 in the directory
    assert _said("统计 /var/log 下有多少个文件") == [("list_dir", "list_dir", {"path": "/var/log"}, [])]
    assert _said("nginx 目录里有几个文件？") == [("list_dir", "list_dir", {"path": "nginx"}, [])]
    # still a grep: a count of a word in a file
    assert _said("access.log 里有几个 502")[0][:2] == ("search_files", "search_files")
    # before: localhost:22 only
    assert _said("检查 web1 的 22 端口和 web2 的 80 端口") == [
        ("network_check", "network_check", {"host": "web1", "port": 22}, []),
        ("network_check", "network_check", {"host": "web2", "port": 80}, [])]


def test_a_typo_with_a_host_a_value_or_an_ops_verb_in_its_clause_is_corrected():
    from server.agent.typos import corrected
    # before: not corrected (the cue words had to stand next to the typo)
    assert corrected("I think the memroy on db-1 is leaking") == "I think the memory on db-1 is leaking"
    assert corrected("the dsik is spinning") == "the disk is spinning"
    assert [i.name for i in parse("I think the memroy on db-1 is leaking")] == ["memory"]
    # names and real words stay
    for text in ("Is Emory University in Atlanta?", "the statues are leaking", "tell me about memroy leaks in Java", "there is a risk on db-1",
                 "the stowage plan for ship-2 is full", "show me how the reindex progresses"):
        assert corrected(text) == text and parse(text) == [], text


@pytest.mark.parametrize("text", ["在 app.log 中搜索 ERROR，不再显示 DEBUG", "在 app.log 中搜索 并查看", "在 app.log 中搜索 兼并统计",
                                  "我想再看看 app.log 的最后10行", "把 a.log 和 b.log 合并统计 ERROR 数量", "在 app.log 中搜索 再检查"])
def test_bing_and_zai_inside_words_join_no_requests(text):
    """并 and 再 inside a word (不再, 合并, 兼并, 想再) or right after a verb with no object are no separators."""
    from server.agent.intents import clauses
    assert clauses(text) == [text]

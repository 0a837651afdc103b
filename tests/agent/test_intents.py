"""The offline agent's intent recognizer, in Chinese and English."""
from __future__ import annotations

import pytest

from server.agent.intents import history_topic, is_chinese, parse


@pytest.mark.parametrize("text,expected", [
    ("查看CPU使用率", [("sys_monitor", {"metric": "cpu"})]),
    ("CPU怎么样", [("sys_monitor", {"metric": "cpu"})]),
    ("内存还剩多少", [("sys_monitor", {"metric": "memory"})]),
    ("磁盘空间", [("sys_monitor", {"metric": "disk"})]),
    ("show disk usage", [("sys_monitor", {"metric": "disk"})]),
    ("network interfaces", [("sys_monitor", {"metric": "network"})]),
    ("网卡信息", [("sys_monitor", {"metric": "network"})]),
    ("系统负载", [("sys_monitor", {"metric": "load"})]),
    ("uptime", [("sys_monitor", {"metric": "uptime"})]),
    ("服务器运行时间", [("sys_monitor", {"metric": "uptime"})]),
    ("how is the server doing?", [("sys_monitor", {"metric": "all"})]),
    ("系统状态", [("sys_monitor", {"metric": "all"})]),
    ("CPU和内存怎么样", [("sys_monitor", {"metric": "cpu"}), ("sys_monitor", {"metric": "memory"})]),
    ("top processes by memory", [("processes", {"sort_by": "memory"})]),
    ("占用内存最多的进程", [("processes", {"sort_by": "memory"})]),
    ("show top 5 processes named python", [("processes", {"sort_by": "cpu", "limit": 5, "name": "python"})]),
    ("检查 127.0.0.1:9999 端口", [("network_check", {"host": "127.0.0.1", "port": 9999})]),
    ("check port 22 on localhost", [("network_check", {"host": "localhost", "port": 22})]),
    ("is localhost:8080 open?", [("network_check", {"host": "localhost", "port": 8080})]),
    ("检查 6379 端口", [("network_check", {"host": "localhost", "port": 6379})]),
    ("6379端口开了吗", [("network_check", {"host": "localhost", "port": 6379})]),
    ("Redis port: 6380", []),                        # a setting stated, not a check (kept as a fact)
    ("our db port is 5432", []),
    ("Redis端口是6380", []),
    ("what time is it", [("clock", {})]),
    ("现在几点", [("clock", {})]),
    ("what did I ask about nginx earlier", [("history_search", {"query": "nginx"})]),
    ("我之前问过nginx什么", [("history_search", {"query": "nginx"})]),
    ("did we talk about disk space before?", [("history_search", {"query": "disk space"})]),
    ("上次我问过关于磁盘的问题吗", [("history_search", {"query": "磁盘"})]),
    ("tail /var/log/syslog", [("read_log", {"path": "/var/log/syslog"})]),
    ("查看 /var/log/dpkg.log 最后 20 行日志", [("read_log", {"path": "/var/log/dpkg.log", "lines": 20})]),
])
def test_recognized(text, expected):
    assert [(i.tool, i.arguments) for i in parse(text)] == expected


@pytest.mark.parametrize("text", ["help", "hello", "你好", "你能做什么", "what can you do?"])
def test_help(text):
    assert [(i.name, i.tool) for i in parse(text)] == [("help", None)]


@pytest.mark.parametrize("text", ["write me a poem", "", "   ", "翻译这句话", "deploy the new release"])
def test_not_understood(text):
    assert parse(text) == []


def test_language_detection_and_topics():
    assert is_chinese("内存") and not is_chinese("memory 50%")
    assert history_topic("search my history for redis cluster") == "redis cluster"
    assert history_topic("what did I ask about it") is None
    assert history_topic("what did I ask about the CPU earlier?") == "CPU"     # an article matches every text
    assert history_topic("what did we say about our backup job?") == "backup job"

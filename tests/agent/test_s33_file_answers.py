"""read_file on a file whose first line is longer than tools.max_file_bytes, and list_dir on a
directory larger than tools.max_dir_scan: what the tools return and what the offline agent says."""
from __future__ import annotations

import random

import orjson

from server.agent.file_answers import RENDERERS
from server.tools import ToolContext, ToolRegistry, ToolsConfig
CUT_MARK = " [… line cut]"        # (server.tools.files.CUT_MARK)

CTX = ToolContext("alice", "s_1")


async def run(tools: ToolRegistry, name: str, **args):
    call = await tools.run(name, args, CTX)
    assert call.status == "success", call.result[:300]
    return orjson.loads(call.result)


async def test_read_file_first_line_over_the_byte_cap_is_shown_cut_not_empty(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    data = orjson.dumps([{"id": i, "host": f"node-{i}", "state": "ok"} for i in range(2000)])   # one line
    assert b"\n" not in data and len(data) > 3 * 4096
    (root / "min.json").write_bytes(data)
    tools = ToolRegistry(ToolsConfig(file_roots=[str(root)], max_file_bytes=4096))
    d = await run(tools, "read_file", path="min.json")
    assert d["lines_returned"] == 1 and d["cut_line"] == 1 and d["bytes"] == len(data)
    assert d["text"].endswith(CUT_MARK)
    shown = d["text"][:-len(CUT_MARK)]
    assert shown and data.decode().startswith(shown) and len(shown) <= 4096
    assert "longer than the read limit" in d["note"]
    en, zh = RENDERERS["read_file"](d, False), RENDERERS["read_file"](d, True)
    assert "empty" not in en and "是空文件" not in zh
    assert '[{"id":0' in en and "Line 1 is longer than the read limit" in en
    assert "第 1 行超过读取上限" in zh


async def test_read_file_cut_line_drops_a_character_cut_in_half(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    (root / "zh.txt").write_text("备份" * 3000, encoding="utf-8")      # 18000 bytes, no newline
    tools = ToolRegistry(ToolsConfig(file_roots=[str(root)], max_file_bytes=4096))
    d = await run(tools, "read_file", path="zh.txt")
    shown = d["text"][:-len(CUT_MARK)]
    assert shown and "\ufffd" not in shown and set(shown) <= {"备", "份"}


async def test_empty_only_when_the_file_has_no_bytes(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    (root / "empty.txt").write_bytes(b"")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(root)]))
    d = await run(tools, "read_file", path="empty.txt")
    assert RENDERERS["read_file"](d, False).endswith("is empty.")
    assert RENDERERS["read_file"](d, True).endswith("是空文件。")
    # a result with nothing shown of a file that has bytes is not called empty (in either language)
    odd = dict(d, path="/srv/big.json", size="2.0 MiB", bytes=2 << 20, read_limit="1.0 MiB")
    assert "empty" not in RENDERERS["read_file"](odd, False)
    assert "是空文件" not in RENDERERS["read_file"](odd, True)


async def test_list_dir_over_the_scan_limit_says_so_and_counts_no_total(tmp_path):
    root = tmp_path / "files"
    big = root / "big"
    big.mkdir(parents=True)
    names = [f"f{i:04d}.log" for i in range(60)]
    for n in names:
        (big / n).write_text("x")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(root)], max_dir_scan=25))
    d = await run(tools, "list_dir", path="big", limit=5)
    assert d["scan_limit"] == 25 and d["examined"] == 25 and d["matched"] == 25 and d["truncated"]
    assert "in directory order" in d["scan_note"]
    shown = [e["name"] for e in d["entries"]]
    assert shown == sorted(shown) and len(shown) == 5
    en, zh = RENDERERS["list_dir"](d, False), RENDERERS["list_dir"](d, True)
    assert "at least 25 entries" in en and "only the first 25" in en and "5 of 25 entries" not in en
    assert "至少有 25 项" in zh and "前 25 项" in zh and "共 25 项" not in zh


async def test_list_dir_keeps_the_first_names_of_the_whole_scan(tmp_path):
    root = tmp_path / "files"
    d0 = root / "many"
    d0.mkdir(parents=True)
    names = [f"n{i:04d}" for i in range(300)]
    random.Random(7).shuffle(names)            # (created in no order: the disk's order is not the names')
    for n in names:
        (d0 / n).write_text("x")
    tools = ToolRegistry(ToolsConfig(file_roots=[str(root)]))
    d = await run(tools, "list_dir", path="many", limit=7)
    assert [e["name"] for e in d["entries"]] == sorted(names)[:7]
    assert d["matched"] == 300 and d["returned"] == 7 and "scan_limit" not in d
    assert RENDERERS["list_dir"](d, False).startswith(f"{d['path']}: 7 of 300 entries:")
    p = await run(tools, "list_dir", path="many", pattern="n01*", limit=3)
    assert [e["name"] for e in p["entries"]] == [f"n{i:04d}" for i in range(100, 103)] and p["matched"] == 100

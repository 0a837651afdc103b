"""bench/kb_recall.py (``make bench CMRC=...``) measures the query speed at 10k chunks only unless
larger sizes are named: the 1M index it built by default took ~312 s of CPU and ~7 GB of memory."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kb_recall.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("kb_recall_s31", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_default_scale_is_10k_and_1m_is_opt_in(tmp_path, capsys, monkeypatch):
    bench = load_bench()
    data = {"data": [{"title": "t", "paragraphs": [
        {"context": "第1号服务器位于杭州机房。", "qas": [{"question": "第1号服务器位于哪个机房？", "answers": [{"text": "杭州"}]}]}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    sizes: list[list[int]] = []
    monkeypatch.setattr(bench, "speed", lambda scale, *a, **kw: sizes.append(list(scale)))
    monkeypatch.setattr(sys, "argv", ["kb_recall.py", str(path), "--big-mb", "0"])
    bench.main()
    monkeypatch.setattr(sys, "argv", ["kb_recall.py", str(path), "--big-mb", "0", "--scale", "10000", "1000000"])
    bench.main()
    assert sizes == [[10_000], [10_000, 1_000_000]]
    assert "default top1 1.000" in capsys.readouterr().out

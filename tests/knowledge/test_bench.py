"""bench/kb_recall.py on a tiny synthetic SQuAD-format file (the real data is not needed)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kb_recall.py"


def test_bench_prints_baseline_default_and_speed(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("kb_recall", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    paragraphs = [
        {"context": f"第{i}号服务器位于{city}机房，负责{job}。它每天凌晨{i}点备份一次。",
         "qas": [{"question": f"第{i}号服务器位于哪个机房？", "id": f"q{i}", "answers": [{"text": city, "answer_start": 0}]}]}
        for i, (city, job) in enumerate([("杭州", "数据库"), ("上海", "缓存"), ("北京", "日志"), ("深圳", "网关"),
                                         ("成都", "队列"), ("西安", "搜索"), ("武汉", "监控"), ("南京", "存储"),
                                         ("广州", "计费")])]
    data = {"version": "x", "data": [{"title": "机房清单", "id": "a", "paragraphs": paragraphs}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["kb_recall.py", str(path), "--scale", "300", "--queries", "5", "--big-mb", "0.05"])
    bench.main()
    out = capsys.readouterr().out
    assert "9 paragraphs in 2 documents" in out and "9 questions" in out
    default = next(line for line in out.splitlines() if line.startswith("default"))
    assert default.split()[1:] == ["top1", "1.000", "top5", "1.000", "top10", "1.000"]
    assert any(line.startswith("baseline top1 ") for line in out.splitlines())
    assert "ingest:" in out and "query p50 at 300 chunks:" in out


def test_bench_split_reports_the_tuning_half_and_the_held_out_half(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("kb_recall", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cities = ["杭州", "上海", "北京", "深圳", "成都", "西安", "武汉", "南京"]
    paragraphs = [{"context": f"第{i}号服务器位于{city}机房。它每天凌晨备份一次。",
                   "qas": [{"question": f"第{i}号服务器位于哪个机房？", "id": f"q{i}",
                            "answers": [{"text": city, "answer_start": 0}]}]}
                  for i, city in enumerate(cities)]
    data = {"version": "x", "data": [{"title": "机房", "id": "a", "paragraphs": paragraphs}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["kb_recall.py", str(path), "--docs-per-file", "2", "--split", "--scale",
                                      "--target", "300", "--overlap", "50"])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    assert "tune: documents 0-1, 4 chunks, 4 questions" in out
    assert "held-out: documents 2-3, 4 chunks, 4 questions" in out
    assert any(line.startswith("tune baseline top1 ") for line in out)
    held = next(line for line in out if line.startswith("held-out default"))
    assert held.split()[2:] == ["top1", "1.000", "top5", "1.000", "top10", "1.000"]
    assert "(chunking 300/50, rerank on)" in out[0]

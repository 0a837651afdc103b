"""bench/locomo_recall.py on a small synthetic LoCoMo-format file (the real data is not needed)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "locomo_recall.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("locomo_recall", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_evidence_ids_are_normalized():
    bench = load_bench()
    assert bench.normalize_evidence(["D8:6; D9:17", "D", "D:11:26", "D1:3", "D1:3"]) == ["D8:6", "D9:17", "D11:26", "D1:3"]
    assert bench.normalize_evidence([]) == []
    assert bench.parse_session_date("1:56 pm on 8 May, 2023") == "2023-05-08T13:56:00+00:00"
    assert bench.parse_session_date("sometime") == ""


def test_bench_scores_a_small_conversation(tmp_path, capsys):
    bench = load_bench()
    conv = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bob",
            "session_1_date_time": "10:00 am on 1 March, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a puppy named Biscuit last week!"},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Congrats! What breed is it?"},
                {"speaker": "Ann", "dia_id": "D1:3", "text": "A beagle. Also I started pottery classes."},
            ],
            "session_2_date_time": "4:00 pm on 9 June, 2023",
            "session_2": [
                {"speaker": "Bob", "dia_id": "D2:1", "text": "I ran my first marathon in Boston.",
                 "blip_caption": "a photo of runners at a finish line"},
                {"speaker": "Ann", "dia_id": "D2:2", "text": "Amazing, how long did it take?"},
            ],
        },
        "qa": [
            {"question": "What is the name of Ann's puppy?", "evidence": ["D1:1"], "category": 1},
            {"question": "Where did Bob run his first marathon?", "evidence": ["D2:1; D1:2"], "category": 4},
            {"question": "What did Ann start?", "evidence": ["D"], "category": 2},
        ],
    }
    path = tmp_path / "mini.json"
    path.write_text(json.dumps([conv]), encoding="utf-8")
    assert bench.main([str(path), "--k", "1", "5"]) == 0
    out = capsys.readouterr().out
    assert "2 conversations" not in out and "1 conversations" in out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith(("default", "bm25"))}
    # 2 scored questions (the one with only a malformed id is skipped); the puppy question is found at 1
    assert rows[("default", "all")][2] == "2"
    assert float(rows[("default", "1")][-1]) == 1.0             # category 1 R@5
    assert float(rows[("default", "4")][-2]) >= 0.5             # marathon evidence D2:1 at rank 1
    assert "R@5: default" in out and "vs plain BM25" in out


def test_pool_puts_every_conversation_in_one_index(tmp_path, capsys):
    bench = load_bench()

    def conv(name: str, pet: str) -> dict:
        return {"sample_id": name, "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "10:00 am on 1 March, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": f"My new {pet} sleeps all day."},
                          {"speaker": "Bob", "dia_id": "D1:2", "text": "Lucky you, I have work."}]},
            "qa": [{"question": f"What sleeps all day, the {pet}?", "evidence": ["D1:1"], "category": 4}]}

    groups = bench.groups([conv("a", "cat"), conv("b", "parrot")], captions=True, pool=True)
    assert len(groups) == 1
    turns, qas = groups[0]
    assert [t[1] for t in turns] == ["c0/D1:1", "c0/D1:2", "c1/D1:1", "c1/D1:2"]
    assert {t[0] for t in turns} == {"c0/session_1", "c1/session_1"}      # sessions stay apart
    assert [q[2] for q in qas] == [{"c0/D1:1"}, {"c1/D1:1"}]
    assert len(bench.groups([conv("a", "cat"), conv("b", "parrot")], captions=True, pool=False)) == 2

    path = tmp_path / "two.json"
    path.write_text(json.dumps([conv("a", "cat"), conv("b", "parrot")]), encoding="utf-8")
    assert bench.main([str(path), "--k", "1", "--pool"]) == 0
    out = capsys.readouterr().out
    assert "pooled: one index of 4 turns" in out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith("default")}
    assert float(rows[("default", "all")][-1]) == 1.0      # each pet question finds its own conversation's turn

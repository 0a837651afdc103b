"""bench/locomo_recall.py on a small synthetic LoCoMo-format file (the real data is not needed)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "locomo_recall.py"


def _exec(name: str, path: Path):
    """The bench script as a module; the entries it puts on sys.path (its own folder: bench/ holds a
    storage.py) are taken off again, so the tests after this one import the project's packages."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod


def load_bench():
    return _exec("locomo_recall", BENCH)


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


DENSE = BENCH.with_name("locomo_dense.py")


def load_dense():
    return _exec("locomo_dense", DENSE)


def write_vectors(path: Path) -> None:
    """A tiny vectors file in scripts/distill_static.py's format: 'martial' and 'kickboxing' close."""
    import numpy as np
    tokens = ["martial", "arts", "kick", "##box", "##ing", "car", "bought", "kickboxing"]
    vecs = np.array([[100, 10, 0], [90, 0, 10], [80, 20, 0], [60, 0, 40], [0, 0, 0],
                     [0, 100, 0], [0, 50, 50], [100, 0, 0]], dtype=np.int8)
    np.savez_compressed(path, tokens=np.array(tokens), vectors=vecs, scales=np.ones(len(tokens), np.float16),
                        meta=np.array("{}"))


def test_static_encoder_is_normalized_deterministic_and_skips_what_it_cannot_read(tmp_path):
    import numpy as np
    dense = load_dense()
    write_vectors(tmp_path / "v.npz")
    enc = dense.StaticEncoder(tmp_path / "v.npz", dims=3, extra_words=True)
    a = enc.encode("What martial arts has John done?")
    assert np.isclose(np.linalg.norm(a), 1.0) and np.array_equal(a, enc.encode("What martial arts has John done?"))
    # whole word row when present, WordPiece pieces otherwise ("kickbox" = kick + ##box)
    assert np.allclose(enc.word_vector("kickboxing"), [100, 0, 0])
    assert np.allclose(enc.word_vector("kickbox"), [70, 10, 20])
    assert enc.word_vector("zzz") is None
    assert float(a @ enc.encode("kickboxing")) > float(a @ enc.encode("bought a car"))
    for text in ("", "the and of", "备份服务器在杭州", "zzz qqq"):      # nothing readable: a zero vector
        assert not enc.encode(text).any()
    assert dense.sentences("Ann: Hi! I ran. [image: a dog]") == ["Ann: Hi!", "Ann: I ran.", "Ann: a dog"]
    assert dense.sentences("no speaker") == ["no speaker"]
    wp_only = dense.StaticEncoder(tmp_path / "v.npz", dims=3, extra_words=False)
    assert np.allclose(wp_only.word_vector("kickboxing"), [100, 0, 0])   # row < N_WORDPIECE: kept


def conversation(names: tuple[str, str], sport: str) -> dict:
    """Eight turns by the same speaker: the question shares no word but the name with the evidence."""
    a, b = names
    filler = [{"speaker": a, "dia_id": f"D1:{i}", "text": f"{a} here: my car number {i} broke down."}
              for i in range(1, 8)]
    return {
        "conversation": {
            "speaker_a": a, "speaker_b": b,
            "session_1_date_time": "10:00 am on 1 March, 2023",
            "session_1": filler,
            "session_2_date_time": "4:00 pm on 9 June, 2023",
            "session_2": [{"speaker": a, "dia_id": "D2:1", "text": f"{a} here: {sport} weekly."}],
        },
        "qa": [{"question": f"What martial arts has {a} done?", "evidence": ["D2:1"], "category": 1},
               {"question": f"Whose car number 3 broke down, {a}?", "evidence": ["D1:3"], "category": 4}],
    }


def test_dense_bench_reports_configurations_and_leave_one_out(tmp_path, capsys):
    dense = load_dense()
    write_vectors(tmp_path / "v.npz")
    data = [conversation(("Ann", "Bob"), "kickboxing"), conversation(("Cy", "Di"), "kickboxing")]
    (tmp_path / "d.json").write_text(json.dumps(data), encoding="utf-8")
    assert dense.main([str(tmp_path / "d.json"), str(tmp_path / "v.npz"), "--dims", "3"]) == 0
    out = capsys.readouterr().out
    lines = {line[:line.find(" multi-hop")].strip(): line for line in out.splitlines() if " multi-hop" in line}
    assert {"default", "uniform ctx  w=1.0", "idf     sent w=0.25", "leave-one-out"} <= set(lines)
    assert "multi-hop 0.000" in lines["default"]               # no shared word: BM25 misses it
    assert "multi-hop 1.000" in lines["uniform own  w=1.0"]    # the synonym turn is found by meaning
    assert "single-hop 1.000" in lines["uniform own  w=1.0"]
    assert "multi-hop 1.000" in lines["uniform sent w=1.0"]
    assert "held-out delta per conversation" in out and "2 conversations" in out

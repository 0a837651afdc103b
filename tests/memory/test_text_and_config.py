"""Token counter, text analysis, stemmer, BM25 index, and config validation."""
from __future__ import annotations

import random

import pytest

from server.config_base import ConfigError
from server.memory.analyze import analyze, plain_words
from server.memory.bm25 import BM25Index
from server.memory.config import DEFAULT_SUMMARY_PROMPT, MemoryConfig, Threshold
from server.memory.stemmer import stem
from server.memory.tokens import ApproxTokenCounter, TokenCounter, truncate_to_tokens

C = ApproxTokenCounter()


# -- tokens ------------------------------------------------------------------------------------------
def test_counter_treats_cjk_as_one_token_per_character():
    assert C.count("我们的备份服务器在杭州机房") == 13
    assert C.count("备份服务器，在哪里？") == 10           # CJK punctuation counts too
    assert C.count("hello world") == 4                    # ceil(5/4) * 2
    assert C.count("internationalization") == 5
    assert C.count("a, b!") == 4
    assert C.count("") == 0
    assert C.count("查看CPU使用率") == 6                   # 5 CJK + "CPU"


def test_counter_counts_messages_with_tool_calls():
    plain = {"role": "user", "content": "check disk"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "sys_monitor", "arguments": '{"metric": "disk"}'}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "/ 42% used"}
    n_plain, n_call, n_result = (C.count_message(m) for m in (plain, call, result))
    assert n_plain == 4 + C.count("check disk")
    assert n_call > 4 + C.count('{"metric": "disk"}')
    assert n_result == 4 + 2 + C.count("/ 42% used")
    assert C.count_messages([plain, call, result]) == 3 + n_plain + n_call + n_result
    assert isinstance(C, TokenCounter)


def test_truncate_fits_and_keeps_the_requested_end():
    rng = random.Random(7)
    alphabet = "ab cd中文，。x1-_/\n한글"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        k = rng.randint(0, 30)
        head = truncate_to_tokens(C, text, k)
        tail = truncate_to_tokens(C, text, k, keep_end=True)
        assert C.count(head) <= k and text.startswith(head)
        assert C.count(tail) <= k and text.endswith(tail)
        if C.count(text) <= k:
            assert head == tail == text


def test_truncate_works_with_any_counter():
    class CharCounter:
        def count(self, text):
            return len(text)

        def count_messages(self, messages):
            return sum(len(m.get("content") or "") for m in messages)

    assert truncate_to_tokens(CharCounter(), "abcdefgh", 3) == "abc"
    assert truncate_to_tokens(CharCounter(), "abcdefgh", 3, keep_end=True) == "fgh"


# -- analysis ------------------------------------------------------------------------------------------
def test_analyze_english_stems_and_drops_stopwords():
    assert analyze("The backups are running nightly") == ["backup", "run", "nightli"]
    assert analyze("Caroline's connections") == ["carolin", "connect"]
    assert "destress" in analyze("I de-stress") and "stress" in analyze("I de-stress")
    assert {"children", "kid"} <= set(analyze("my kids"))      # informal form + the usual word
    assert plain_words("The Backups, running!") == ["the", "backups", "running"]


def test_analyze_chinese_unigrams_and_bigrams():
    terms = analyze("备份服务器在杭州")
    assert {"备份", "服务", "务器", "杭州", "备", "杭"} <= set(terms)
    assert "在" not in terms                                  # a function character alone
    assert "器在" in terms                                    # but kept inside bigrams
    assert "州。" not in analyze("杭州。机房") and "州机" not in analyze("杭州。机房")
    assert {"cpu", "使用", "查看"} <= set(analyze("查看CPU使用率"))


def test_porter_stemmer_reference_words():
    pairs = {"caresses": "caress", "ponies": "poni", "relational": "relat", "hopping": "hop",
             "rotation": "rotat", "rotates": "rotat", "generalization": "gener", "running": "run",
             "agreed": "agre", "happy": "happi", "electrical": "electr", "adjustment": "adjust"}
    assert {w: stem(w) for w in pairs} == pairs
    assert stem("k8s") == "k8s" and stem("ab") == "ab"


def test_stemmer_takes_pathological_words():
    # the hand-written stemmer recursed once per "y" (RecursionError at ~1,000 characters)
    assert stem("y" * 1500) == "y" * 1499 + "i"                # Porter step 1c: y -> i after a vowel-ish y
    assert len(stem("y" * 100_000)) == 100_000
    assert analyze("y" * 1500 + " backups") == ["y" * 1499 + "i", "backup"]


# -- BM25 ----------------------------------------------------------------------------------------------
def test_bm25_ranks_add_remove_and_filter():
    idx = BM25Index()
    idx.add("a", ["disk", "full", "on", "web1"])
    idx.add("b", ["cpu", "high", "on", "web1"])
    idx.add("c", ["disk", "disk", "slow"])
    assert [d for d, _ in idx.search(["disk"], 5)] == ["c", "a"]
    assert idx.search(["cpu", "web1"], 1)[0][0] == "b"
    assert idx.search(["disk"], 5, accept=lambda d: d != "c")[0][0] == "a"
    assert idx.search(["nothing"], 5) == [] and idx.search(["disk"], 0) == []
    assert idx.remove("c") and not idx.remove("c")
    assert [d for d, _ in idx.search(["disk"], 5)] == ["a"] and idx.doc_freq("slow") == 0
    idx.add("a", {"memory": 2.0})                              # replacing a document
    assert idx.search(["disk"], 5) == [] and len(idx) == 2
    assert idx.search({"memory": 1.0}, 5)[0][0] == "a"


def test_bm25_scales_to_ten_thousand_documents():
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(3000)]
    idx = BM25Index()
    for i in range(10_000):
        idx.add(i, rng.choices(vocab, k=30))
    idx.add("needle", ["zebra", "w1", "w2"])
    assert idx.search(["zebra", "w5"], 3)[0][0] == "needle"
    for i in range(0, 10_000, 2):
        idx.remove(i)
    assert len(idx) == 5001 and idx.search(["zebra"], 1)[0][0] == "needle"


# -- config -----------------------------------------------------------------------------------------------
def test_config_defaults():
    cfg = MemoryConfig.from_dict({})
    s = cfg.summarization
    assert s.enabled and s.model is None and s.trim_tokens_to_summarize == 4000
    assert s.trigger == [Threshold(type="tokens", value=3000), Threshold(type="messages", value=40)]
    assert s.keep == Threshold(type="messages", value=20) and s.max_failures_before_fallback == 3
    assert s.summary_prompt == DEFAULT_SUMMARY_PROMPT and "never invent" in s.summary_prompt.lower()
    assert (cfg.recall.enabled, cfg.recall.k, cfg.recall.token_budget) == (True, 4, 800)
    assert cfg.recall.embeddings.enabled is False
    assert (cfg.context.recent_turns, cfg.context.window, cfg.context.reserve_output_tokens) == (5, 16000, 1024)
    assert cfg.context.budget == 16000 - 1024 and cfg.context.max_sessions_cached == 256


def test_config_accepts_one_trigger_or_a_list_and_null_trim():
    cfg = MemoryConfig.from_dict({
        "summarization": {"trigger": {"type": "fraction", "value": 0.6}, "keep": {"type": "tokens", "value": 500},
                          "trim_tokens_to_summarize": None, "model": "cheap"},
        "context": {"max_input_tokens": 8000}})
    assert cfg.summarization.trigger == [Threshold(type="fraction", value=0.6)]
    assert cfg.summarization.trim_tokens_to_summarize is None and cfg.summarization.model == "cheap"
    assert MemoryConfig.from_dict({"summarization": {"trim_tokens_to_summarize": 0}}).summarization \
        .trim_tokens_to_summarize is None
    cfg = MemoryConfig.from_dict({"summarization": {"trigger": [{"type": "messages", "value": 10},
                                                                {"type": "tokens", "value": 99}]}})
    assert [t.type for t in cfg.summarization.trigger] == ["messages", "tokens"]


@pytest.mark.parametrize("d, path, words", [
    ({"summarization": {"trigger": {"type": "fraction", "value": 0.5}}}, "summarization.trigger",
     "context.max_input_tokens"),
    ({"summarization": {"trigger": [{"type": "messages", "value": 5}, {"type": "fraction", "value": 0.5}]}},
     "summarization.trigger[1]", "context.max_input_tokens"),
    ({"summarization": {"keep": {"type": "fraction", "value": 0.2}}}, "summarization.keep",
     "context.max_input_tokens"),
    ({"summarization": {"trigger": [{"type": "words", "value": 5}]}}, "summarization.trigger[0].type",
     "tokens, messages, fraction"),
    ({"summarization": {"trigger": {"type": "tokens", "value": 0}}}, "summarization.trigger.value", ">= 1"),
    ({"summarization": {"trigger": {"type": "tokens"}}}, "summarization.trigger.value", "missing"),
    ({"summarization": {"trigger": []}}, "summarization.trigger", "non-empty list"),
    ({"summarization": {"trigger": {"type": "fraction", "value": 1.5}}}, "summarization.trigger.value",
     "fraction in (0, 1]"),
    ({"summarization": {"keep": {"type": "messages", "value": -1}}}, "summarization.keep.value", ">= 0"),
    ({"summarization": {"keep": {"type": "messages", "value": 3, "extra": 1}}}, "summarization.keep.extra",
     "unknown key"),
    ({"summarization": {"trim_tokens_to_summarize": -5}}, "summarization.trim_tokens_to_summarize", "0..10000000"),
    ({"summarization": {"summary_prompt": "  "}}, "summarization.summary_prompt", "non-empty"),
    ({"summarization": {"model": ""}}, "summarization.model", "empty string"),
    ({"summarization": {"max_failures_before_fallback": 0}}, "summarization.max_failures_before_fallback", "1..1000"),
    ({"summarization": {"enabled": "yes"}}, "summarization.enabled", "true or false"),
    ({"recall": {"k": -1}}, "recall.k", "0..50"),
    ({"recall": {"token_budget": "big"}}, "recall.token_budget", "integer"),
    ({"recall": {"embeddings": {"enabled": True, "model": "m"}}}, "recall.embeddings.base_url", "required"),
    ({"recall": {"embeddings": {"enabled": True, "base_url": "ftp://x", "model": "m"}}},
     "recall.embeddings.base_url", "http(s) URL"),
    ({"recall": {"embeddings": {"timeout_s": 0}}}, "recall.embeddings.timeout_s", "in (0, 600]"),
    ({"context": {"max_input_tokens": 1000, "reserve_output_tokens": 900}}, "context.reserve_output_tokens",
     "must be >= 256"),
    ({"context": {"recent_turns": 1.5}}, "context.recent_turns", "integer"),
    ({"context": {"max_input_tokens": 100}}, "context.max_input_tokens", "512..100000000"),
    ({"context": {"system_prompt": "x"}}, "context.system_prompt", "unknown key"),
    ({"context": {"max_sessions_cached": 0}}, "context.max_sessions_cached", "1..100000"),
    ({"memory": {}}, "memory", "unknown key"),
])
def test_config_errors_are_precise(d, path, words):
    with pytest.raises(ConfigError) as exc:
        MemoryConfig.from_dict(d)
    assert exc.value.path == path
    assert words in str(exc.value)

"""Config names that follow the seed terms, and the token counter choice (issue 16)."""
from __future__ import annotations

import pytest

from server.config_base import ConfigError
from server.memory.config import DEFAULT_SUMMARY_PROMPT, ContextConfig, SummarizationConfig
from server.memory.tokens import ApproxTokenCounter, TiktokenCounter, make_counter, splits_at_whitespace


def test_model_name_is_another_name_of_model():
    assert SummarizationConfig.from_dict({"model_name": "cheap"}).model == "cheap"
    assert SummarizationConfig.from_dict({"model": "cheap", "model_name": "cheap"}).model == "cheap"
    with pytest.raises(ConfigError, match="summarization.model_name.*set one of them"):
        SummarizationConfig.from_dict({"model": "a", "model_name": "b"})
    with pytest.raises(ConfigError, match="summarization.model_name"):
        SummarizationConfig.from_dict({"model_name": " "})


def test_summary_prompt_file_is_read_at_load(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("  Summarize in three bullets.\n", encoding="utf-8")
    cfg = SummarizationConfig.from_dict({"summary_prompt_file": str(path)})
    assert cfg.summary_prompt == "Summarize in three bullets." and cfg.summary_prompt_file == str(path)
    assert SummarizationConfig.from_dict({}).summary_prompt == DEFAULT_SUMMARY_PROMPT


@pytest.mark.parametrize("content, words", [(None, "cannot read"), (b"", "is empty"), (b"\xff\xfe", "not UTF-8"),
                                            (b"x" * 70_000, "larger than")])
def test_bad_summary_prompt_files_are_named(tmp_path, content, words):
    path = tmp_path / "prompt.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match="summarization.summary_prompt_file") as err:
        SummarizationConfig.from_dict({"summary_prompt_file": str(path)})
    assert words in str(err.value)


def test_summary_prompt_and_its_file_exclude_each_other(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("x")
    with pytest.raises(ConfigError, match="not both"):
        SummarizationConfig.from_dict({"summary_prompt": "y", "summary_prompt_file": str(path)})


def test_token_counter_setting():
    assert ContextConfig.from_dict({}).token_counter == "auto"
    assert ContextConfig.from_dict({"token_counter": "estimate"}).token_counter == "estimate"
    with pytest.raises(ConfigError, match="context.token_counter"):
        ContextConfig.from_dict({"token_counter": "words"})
    assert type(make_counter("estimate")) is ApproxTokenCounter


def test_auto_falls_back_to_the_estimator_without_tiktoken():
    try:    # tiktoken is an optional extra, not installed by the dev extra
        import tiktoken  # noqa: F401
    except ImportError:
        assert type(make_counter("auto")) is ApproxTokenCounter
        with pytest.raises(ConfigError, match="not installed"):
            ContextConfig.from_dict({"token_counter": "tiktoken"})
    else:
        assert isinstance(make_counter("auto"), (TiktokenCounter, ApproxTokenCounter))


class _Bytes:
    """A tiny stand-in with tiktoken's Encoding interface: one token per UTF-8 byte."""
    name = "bytes"

    def encode(self, text, disallowed_special=()):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


def test_tiktoken_counter_counts_and_cuts_with_the_encoding():
    counter = TiktokenCounter(_Bytes())
    assert counter.count("abc") == 3 and counter.count("中") == 3 and counter.count("") == 0
    assert counter.truncate("ab中cd", 4) == "ab" and counter.truncate("ab中cd", 4, keep_end=True) == "cd"
    assert counter.truncate("abc", 5) == "abc"
    msgs = [{"role": "user", "content": "abcd"}]
    assert counter.count_messages(msgs) == counter.count_messages([]) + counter.count_message(msgs[0])
    assert not splits_at_whitespace(counter)

"""Approximate token counting that treats CJK text properly, behind a replaceable interface.

The default counter needs no tokenizer files: a CJK character (Han, kana, Hangul) counts as one
token, a run of letters/digits as ``ceil(len / 4)``, any other visible character as one token, and
every chat message adds a fixed overhead. It errs on the generous side, which keeps assembled
prompts safely inside the model window. Any object with ``count`` and ``count_messages`` can
replace it: ``make_counter`` picks one from ``[context] token_counter`` (``auto``: tiktoken when it
is installed and its encoding loads, else the estimator; ``estimate``; ``tiktoken``: required).
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Protocol, runtime_checkable

# CJK Unified Ideographs (+ extension A, compatibility), CJK punctuation, kana, Hangul, fullwidth forms.
CJK_CLASS = (
    "\u3000-\u303f\u3040-\u309f\u30a0-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
)
_TOKEN_RE = re.compile(rf"([{CJK_CLASS}])|([^\W_{CJK_CLASS}]+)|(\S)", re.UNICODE)
# One pass: a letter/digit run yields ceil(len/4) matches of up to 4 characters, every other visible
# character (CJK, punctuation, "_", and the ideographic space U+3000, which is CJK) one match.
_COUNT_RE = re.compile(rf"[^\W_{CJK_CLASS}]{{1,4}}|\S|\u3000")

log = logging.getLogger(__name__)

MESSAGE_OVERHEAD = 4      # role marker and separators per chat message
PROMPT_OVERHEAD = 3       # priming of the assistant reply
TOOL_CALL_OVERHEAD = 6    # id, type and function wrapper of one tool call


@runtime_checkable
class TokenCounter(Protocol):
    """What the memory layer needs from a token counter."""

    def count(self, text: str) -> int: ...
    def count_messages(self, messages: list[dict[str, Any]]) -> int: ...


class ApproxTokenCounter:
    """The default counter: no dependencies, deterministic, CJK-aware (see module docstring).

    ``additive``: ``count_messages(ms) == count_messages([]) + sum(count_message(m) for m in ms)``,
    so the assembler may add up per-message counts instead of recounting a whole prompt.
    """

    additive = True

    def count(self, text: str) -> int:
        """Approximate tokens in ``text`` (CJK and other visible characters 1, a word run ceil(len / 4))."""
        return len(_COUNT_RE.findall(text)) if text else 0

    def truncate(self, text: str, max_tokens: int, keep_end: bool = False) -> str:
        """The longest prefix (suffix with ``keep_end``) counting at most ``max_tokens``, in one pass."""
        if max_tokens <= 0:
            return ""
        if not keep_end:
            used = 0
            for m in _TOKEN_RE.finditer(text):
                word = m.group(2)
                cost = (len(word) + 3) // 4 if word is not None else 1
                if used + cost > max_tokens:
                    if word is not None and used < max_tokens:     # part of a long word still fits
                        return text[: m.start() + 4 * (max_tokens - used)]
                    return text[: m.start()]
                used += cost
            return text
        rev = self.truncate(text[::-1], max_tokens)
        return rev[::-1]

    def count_message(self, message: dict[str, Any]) -> int:
        """Tokens of one OpenAI-style chat message, tool calls included."""
        n = MESSAGE_OVERHEAD
        content = message.get("content")
        if isinstance(content, str):
            n += self.count(content)
        elif isinstance(content, list):          # multi-part content
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    n += self.count(part["text"])
        if message.get("name"):
            n += self.count(str(message["name"]))
        if message.get("tool_call_id"):
            n += 2
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            n += TOOL_CALL_OVERHEAD + self.count(str(fn.get("name", ""))) + self.count(args)
        return n

    def count_messages(self, messages: list[dict[str, Any]]) -> int:
        """Tokens of a whole prompt (every message plus the reply priming)."""
        return PROMPT_OVERHEAD + sum(self.count_message(m) for m in messages)


class TiktokenCounter(ApproxTokenCounter):
    """Exact BPE counts with a tiktoken ``Encoding`` (same per-message overheads as the estimator)."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.name = str(getattr(encoding, "name", "tiktoken"))

    def count(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=())) if text else 0

    def truncate(self, text: str, max_tokens: int, keep_end: bool = False) -> str:
        if max_tokens <= 0:
            return ""
        ids = self.encoding.encode(text, disallowed_special=())
        if len(ids) <= max_tokens:
            return text
        part = self.encoding.decode(ids[-max_tokens:] if keep_end else ids[:max_tokens])
        # a cut inside a multi-byte character decodes to U+FFFD: drop it rather than store a wrong character
        return part.lstrip("\ufffd") if keep_end else part.rstrip("\ufffd")


class CounterUnavailable(RuntimeError):
    """``token_counter = "tiktoken"`` but tiktoken or its encoding cannot be loaded."""


def make_counter(choice: str = "auto", encoding: str = "o200k_base") -> TokenCounter:
    """The counter ``[context] token_counter`` names (see the module docstring)."""
    if choice == "estimate":
        return ApproxTokenCounter()
    try:
        import tiktoken      # optional: pip install 'nplt-assistant[tiktoken]'
        counter: TokenCounter = TiktokenCounter(tiktoken.get_encoding(encoding))
    except Exception as exc:   # noqa: BLE001 - not installed, unknown encoding, encoding file not cached
        if choice == "tiktoken":
            raise CounterUnavailable(f"token_counter = \"tiktoken\" but it cannot be used: "
                                     f"{type(exc).__name__}: {exc}") from None
        log.info("token counter: the estimator (tiktoken not usable: %s)", type(exc).__name__)
        return ApproxTokenCounter()
    log.info("token counter: tiktoken %s", encoding)
    return counter


def splits_at_whitespace(counter: TokenCounter) -> bool:
    """True for the default counter: text joined at whitespace counts the sum of its parts
    (``count(a + " " + b) == count(a) + count(b)``: no token spans whitespace), and a plain
    ``{"role", "content"}`` message counts ``MESSAGE_OVERHEAD + count(content)``."""
    return type(counter) is ApproxTokenCounter


def message_tokens(counter: TokenCounter, message: dict[str, Any]) -> int:
    """Tokens of one message with any counter (the per-prompt overhead excluded)."""
    one = getattr(counter, "count_message", None)
    if one is not None:
        return int(one(message))
    return int(counter.count_messages([message]) - counter.count_messages([]))


def truncate_to_tokens(counter: TokenCounter, text: str, max_tokens: int, *, keep_end: bool = False) -> str:
    """The longest prefix (or suffix with ``keep_end``) of ``text`` that counts at most ``max_tokens``."""
    if max_tokens <= 0 or not text:
        return ""
    fast = getattr(counter, "truncate", None)
    if fast is not None:                 # one pass, stopping at the cut (no count of the whole text first)
        return fast(text, max_tokens, keep_end)
    if counter.count(text) <= max_tokens:
        return text
    lo, hi = 0, len(text)            # invariant: a cut of length lo fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        part = text[-mid:] if keep_end else text[:mid]
        if counter.count(part) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[-lo:] if (keep_end and lo) else text[:lo]

"""Tool calls rebuilt from a model's streamed deltas (``ToolCallAssembler``): id and name usually
first, arguments in pieces (kept as a list, joined once), names and ids bounded as they arrive."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from server.tools.registry import new_call_id

DEFAULT_MAX_TOOL_NAME_CHARS = 64     # [llm] max_tool_name_chars: OpenAI's limit on a function name
DEFAULT_MAX_TOOL_CALL_ID_CHARS = 256  # [llm] max_tool_call_id_chars


@dataclass(slots=True)
class AssembledCall:
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    name_chars: int = 0        # the length of the name as sent (``name`` is cut to the limit)
    pieces: list[str] = field(default_factory=list)   # the arguments as streamed, joined by ``calls()``


class ToolCallAssembler:
    """Rebuilds tool calls from streamed deltas: id and name usually come first, arguments in pieces.

    Deltas are keyed by ``index``; a server that omits it gets a new slot whenever a new id appears.
    A delta opens a new slot at its index too (the calls keep the order they were opened in) when
    - it carries a function name and an id other than the one of the call open at that index:
      Ollama streams parallel calls all with index 0 and distinct ids (they were merged into one
      broken call, names joined "clocksys_monitor", arguments "{}{...}"), or
    - it carries a function name and arguments, and the call open there has a name and arguments
      that are a whole JSON object already: a whole call sent again (same id, or none), whose
      arguments could only make the first call's invalid ("{}{}").
    A name repeated with a piece of arguments that does not start a JSON object, or with none,
    stays a repeat (a few servers repeat the name in every delta).
    Names and ids are bounded as they arrive (a model may send megabytes of either): a name over
    ``max_name_chars`` keeps that many characters and its length as sent in ``name_chars`` (the
    caller refuses the call as an unknown tool), an id over ``max_id_chars`` is replaced by a
    generated one in ``calls()``.
    """

    def __init__(self, max_name_chars: int = DEFAULT_MAX_TOOL_NAME_CHARS,
                 max_id_chars: int = DEFAULT_MAX_TOOL_CALL_ID_CHARS) -> None:
        self._slots: list[AssembledCall] = []          # every call, in the order opened
        self._open: dict[int, AssembledCall] = {}      # stream index -> the call open at it now
        self._last: AssembledCall | None = None
        self.max_name_chars = max_name_chars
        self.max_id_chars = max_id_chars

    def add(self, deltas: list[Any]) -> None:
        """Merge the ``tool_calls`` list of one streamed delta (plain dicts, as decoded from JSON)."""
        for tc in deltas:
            if not isinstance(tc, dict):
                continue
            index = tc.get("index")
            tc_id = tc.get("id")
            if not (tc_id and isinstance(tc_id, str)):
                tc_id = None
            elif len(tc_id) > self.max_id_chars:
                # a stand-in longer than the limit (so ``calls()`` replaces it), equal for equal ids
                tc_id = f"{tc_id[:self.max_id_chars]}…{len(tc_id)}"
            fn = tc.get("function")
            if not isinstance(fn, dict):
                fn = None
            if not isinstance(index, int):
                last = self._last
                if last is None or (tc_id and last.id and tc_id != last.id):
                    index = len(self._slots)
                    while index in self._open:
                        index += 1
                else:
                    index = last.index
            slot = self._open.get(index)
            if slot is None or _starts_another(slot, tc_id, fn):
                slot = AssembledCall(index)
                self._slots.append(slot)
                self._open[index] = slot
            self._last = slot
            if tc_id:
                slot.id = tc_id
            if fn is not None:
                name = fn.get("name")
                if name and isinstance(name, str):
                    # Most servers send the name once; a few repeat it in every delta.
                    keep = self.max_name_chars + 1          # enough to tell a name over the limit
                    if not slot.name or (slot.name_chars == len(name) and slot.name == name[:keep]):
                        slot.name, slot.name_chars = name[:keep], len(name)
                    else:
                        slot.name, slot.name_chars = (slot.name + name[:keep])[:keep], slot.name_chars + len(name)
                arguments = fn.get("arguments")
                if arguments:
                    # Off-spec non-string arguments are kept as JSON text rather than failing the turn.
                    # Kept as pieces, joined once: ``+=`` on the attribute copied the whole text at every
                    # piece (100 MB in 64 KB pieces: ~80 GB copied).
                    slot.pieces.append(arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode())

    def calls(self, taken: set[str] | None = None) -> list[AssembledCall]:
        """The calls in index order. A missing id, one over ``max_id_chars``, or one already in
        ``taken`` (the ids of the turn so far, updated here) or used twice in the step, is replaced by
        a generated unique one, so the stored calls and the follow-up request carry the same, distinct
        ids. A call without a name is returned with ``name == ""`` (the caller rejects it); a name over
        ``max_name_chars`` is cut to it (``name_chars`` says how long it was); a slot with nothing in
        it is skipped."""
        taken = set() if taken is None else taken
        out = []
        for slot in sorted(self._slots, key=lambda s: s.index):    # (stable: opened order within an index)
            if slot.pieces:
                slot.arguments, slot.pieces = slot.arguments + "".join(slot.pieces), []
            if not (slot.name or slot.id or slot.arguments.strip()):
                continue
            if slot.name_chars > self.max_name_chars:
                slot.name = slot.name[:self.max_name_chars]
            if not slot.id or len(slot.id) > self.max_id_chars or slot.id in taken:
                slot.id = new_call_id()
            taken.add(slot.id)
            out.append(slot)
        return out

    def __bool__(self) -> bool:
        return bool(self._slots)


def _starts_another(slot: AssembledCall, tc_id: str | None, fn: dict[str, Any] | None) -> bool:
    """Whether a delta for ``slot``'s index is another call. It names a function (a call's first
    delta always does) and either carries another id than the slot's, or carries arguments that
    start a JSON object while the slot has a name and whole-object arguments (checked only then: the
    slot's pieces are joined and parsed once per such delta, and a piece that continues valid JSON
    never starts with ``{`` right after one that ends with ``}``). A delta of arguments alone under
    another id continues the call (its id is taken, as before)."""
    if fn is None:
        return False
    name, arguments = fn.get("name"), fn.get("arguments")
    if not (name and isinstance(name, str)):
        return False
    if tc_id and slot.id and tc_id != slot.id:
        return True
    if not slot.name or not slot.pieces:
        return False
    if isinstance(arguments, dict):
        pass                    # off-spec: a whole object at once
    elif not (isinstance(arguments, str) and arguments.lstrip().startswith("{")):
        return False
    if not slot.pieces[-1].rstrip().endswith("}"):
        return False
    joined = "".join(slot.pieces)
    slot.pieces = [joined]
    try:
        return isinstance(orjson.loads(joined), dict)
    except orjson.JSONDecodeError:
        return False

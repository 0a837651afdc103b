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
    Names and ids are bounded as they arrive (a model may send megabytes of either): a name over
    ``max_name_chars`` keeps that many characters and its length as sent in ``name_chars`` (the
    caller refuses the call as an unknown tool), an id over ``max_id_chars`` is replaced by a
    generated one in ``calls()``.
    """

    def __init__(self, max_name_chars: int = DEFAULT_MAX_TOOL_NAME_CHARS,
                 max_id_chars: int = DEFAULT_MAX_TOOL_CALL_ID_CHARS) -> None:
        self._slots: dict[int, AssembledCall] = {}
        self._last: int | None = None
        self.max_name_chars = max_name_chars
        self.max_id_chars = max_id_chars

    def add(self, deltas: list[Any]) -> None:
        """Merge the ``tool_calls`` list of one streamed delta (plain dicts, as decoded from JSON)."""
        for tc in deltas:
            if not isinstance(tc, dict):
                continue
            index = tc.get("index")
            tc_id = tc.get("id")
            if isinstance(tc_id, str) and len(tc_id) > self.max_id_chars:
                # a stand-in longer than the limit (so ``calls()`` replaces it), equal for equal ids
                tc_id = f"{tc_id[:self.max_id_chars]}…{len(tc_id)}"
            if not isinstance(index, int):
                if self._last is None or (tc_id and self._slots[self._last].id and tc_id != self._slots[self._last].id):
                    index = len(self._slots)
                else:
                    index = self._last
            slot = self._slots.setdefault(index, AssembledCall(index))
            self._last = index
            if tc_id and isinstance(tc_id, str):
                slot.id = tc_id
            fn = tc.get("function")
            if isinstance(fn, dict):
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
        for index in sorted(self._slots):
            slot = self._slots[index]
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

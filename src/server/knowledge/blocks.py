"""What a parser hands the chunker: a flat list of headings and text blocks with their location."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Block:
    text: str
    level: int = 0               # 0 = body text; 1..6 = a heading of that level
    page: int | None = None      # 1-based (pdf)
    line_start: int | None = None   # 1-based, inclusive (text formats)
    line_end: int | None = None
    # a table row's block: the table's header row (a markdown table's header and delimiter lines),
    # which the chunker puts at the start of every chunk that begins inside the table's rows
    header: str | None = None

    @property
    def is_heading(self) -> bool:
        return self.level > 0

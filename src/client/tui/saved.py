"""What the TUI remembers between runs: the theme picked in the palette and the input history.

One small JSON file (``client.paths.state_file()``), written atomically (a temporary file renamed
over it). A missing file is a first run; an unreadable or malformed one is logged and ignored (the
TUI starts with nothing remembered and overwrites it on the next change). Callers run ``load`` and
``save`` off the event loop.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MAX_HISTORY = 200   # inputs kept for Up/Down recall (the same bound as the input's own list)


@dataclass(slots=True)
class SavedState:
    theme: str | None = None
    history: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> SavedState:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            log.warning("ignoring the saved TUI state %s: %s", path, exc)
            return cls()
        if not isinstance(data, dict):
            log.warning("ignoring the saved TUI state %s: not a JSON object", path)
            return cls()
        theme = data.get("theme")
        history = data.get("history")
        return cls(theme if isinstance(theme, str) and theme else None,
                   [h for h in history if isinstance(h, str)][-MAX_HISTORY:] if isinstance(history, list) else [])

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"theme": self.theme, "history": self.history[-MAX_HISTORY:]},
                                  ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)

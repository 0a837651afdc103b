"""What the TUI remembers between runs: the theme picked in the palette and the input history.

One small JSON file (``client.paths.state_file()``), written atomically (a temporary file renamed
over it), private: the inputs may hold passwords, so the file is 0600 and its folder 0700
(``client.paths.open_private``, ``private_dir``). Only inputs of at most ``MAX_SAVED_INPUT_CHARS``
characters are saved (a longer one is recalled in the running TUI only). A missing file is a first run; an unreadable or
malformed one is logged and ignored (the TUI starts with nothing remembered and overwrites it on the
next change). Callers run ``load`` and
``update`` off the event loop.

Several TUIs may run at once (two terminals), each with the file loaded at its start. So a TUI never
writes its whole state back: ``update`` re-reads the file under an exclusive lock, changes only what
this TUI changed (a theme it picked, the inputs it sent since its last save, appended after what is
there) and writes it back; neither TUI loses the other's inputs.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from client import paths

log = logging.getLogger(__name__)

MAX_HISTORY = 200   # inputs kept for Up/Down recall (the same bound as the input's own list)
#: the longest input (characters) saved for recall after a restart; a longer one (a pasted log, a
#: whole file) is recalled in the running TUI only, not saved: the file is rewritten on every send,
#: and 200 such inputs made it megabytes (up to ~19 MB). Inputs over it in an older file are dropped.
MAX_SAVED_INPUT_CHARS = 4000


def savable(text: str) -> bool:
    """Whether an input is kept in the state file (at most ``MAX_SAVED_INPUT_CHARS`` characters)."""
    return len(text) <= MAX_SAVED_INPUT_CHARS


def merged_history(older: Sequence[str], newer: Sequence[str]) -> list[str]:
    """``older`` then ``newer``, each input once at its latest place, the newest ``MAX_HISTORY``
    (an input longer than ``MAX_SAVED_INPUT_CHARS`` is left out)."""
    seen: set[str] = set()
    out: list[str] = []
    for text in reversed([*older, *newer]):
        if text not in seen and savable(text):
            seen.add(text)
            out.append(text)
            if len(out) == MAX_HISTORY:
                break
    return out[::-1]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between the TUIs saving to ``path`` (a ``.lock`` file beside it; blocking)."""
    paths.private_dir(path.parent)
    with open(paths.open_private(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND),
              "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
                   [h for h in history if isinstance(h, str) and savable(h)][-MAX_HISTORY:]
                   if isinstance(history, list) else [])

    def save(self, path: Path) -> None:
        """Write this state as the whole file (atomically; ``update`` is what a running TUI uses)."""
        paths.private_dir(path.parent)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        history = [h for h in self.history if savable(h)][-MAX_HISTORY:]
        text = json.dumps({"theme": self.theme, "history": history}, ensure_ascii=False)
        with open(paths.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    @classmethod
    def update(cls, path: Path, *, theme: str | None = None, added: Sequence[str] = ()) -> SavedState:
        """Merge into the file what one TUI changed: ``theme`` (None: keep the file's) and the inputs
        ``added`` since its last update (after the file's, deduplicated, capped); returns the result."""
        with _locked(path):
            saved = cls.load(path)
            saved = cls(theme or saved.theme, merged_history(saved.history, added))
            saved.save(path)
        return saved

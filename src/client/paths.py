"""The user's folders the client reads and writes, from platformdirs (XDG respected on Linux).

- config: ``$XDG_CONFIG_HOME/nplt/client.toml`` (default ``~/.config/nplt/client.toml``)
- saved TUI state (theme, input history): ``$XDG_STATE_HOME/nplt/tui.json`` (``~/.local/state/nplt``)
- logs: ``$XDG_STATE_HOME/nplt/log/client.log``
- exports: an ``NPLT`` folder in the documents folder (``XDG_DOCUMENTS_DIR``, else ``~/Documents``)

The saved state and the log hold what the user typed (a message may hold a password), so they are
private: their folders are made ``PRIVATE_DIR_MODE`` (0700: folders this client creates, and the
folder that holds the files, tightened when an older version made it 0755) and the files
``PRIVATE_FILE_MODE`` (0600, whatever the umask): ``private_dir``, ``open_private``,
``PrivateRotatingFileHandler``.
"""
from __future__ import annotations

import logging.handlers
import os
import stat
from pathlib import Path
from typing import Any

import platformdirs

APP_NAME = "nplt"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def config_file() -> Path:
    """The client config file read when no ``--config`` / ``NPLT_CLIENT_CONFIG`` is given."""
    return platformdirs.user_config_path(APP_NAME) / "client.toml"


def state_file() -> Path:
    """What the TUI remembers between runs (the theme picked in the palette, the input history)."""
    return platformdirs.user_state_path(APP_NAME) / "tui.json"


def log_file() -> Path:
    """The TUI's log file (client library warnings: invalid frames, failed cancels, ...). Its folder is
    made private (``private_dir``) and the file created ``PRIVATE_FILE_MODE`` when missing, so whatever
    handler opens it appends to a private file; a failure here is left to that opener to report."""
    path = platformdirs.user_log_path(APP_NAME) / "client.log"
    try:
        private_dir(path.parent)
        os.close(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
    except OSError:
        pass
    return path


def export_dir() -> Path:
    """Where the TUI proposes to save exports: an ``NPLT`` folder in the user's documents folder
    (``XDG_DOCUMENTS_DIR``, else ``~/Documents``), never the current directory."""
    return platformdirs.user_documents_path() / "NPLT"


def private_dir(path: Path) -> Path:
    """Create folder ``path`` (and the missing folders above it) readable by the user only, and make
    ``path`` itself so when it already exists open to others (an older client made it 0755); returns
    it. Folders that already exist above it are left as they are (``~/.local`` is not ours)."""
    missing: list[Path] = []
    here = path
    while not here.exists():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:          # made meanwhile (another TUI starting)
            pass
        os.chmod(folder, PRIVATE_DIR_MODE)   # (mkdir's mode is masked by the umask)
    st = path.stat()
    if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.getuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    return path


def open_private(path: Path | str, flags: int) -> int:
    """``os.open(path, flags)`` for a file only the user may read: created ``PRIVATE_FILE_MODE``, and an
    existing one (written by an older client) made so; returns the descriptor."""
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.getuid():
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A ``RotatingFileHandler`` whose files (the first and each one started at a rollover) are
    ``PRIVATE_FILE_MODE``: the log quotes what the user sent and the server answered."""

    def _open(self) -> Any:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in self.mode else os.O_TRUNC)
        fd = open_private(self.baseFilename, flags)
        return open(fd, "a" if "a" in self.mode else "w", encoding=self.encoding, errors=self.errors)

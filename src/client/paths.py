"""The user's folders the client writes to, from platformdirs (XDG respected on Linux)."""
from __future__ import annotations

from pathlib import Path

import platformdirs

APP_NAME = "nplt"


def export_dir() -> Path:
    """Where the TUI proposes to save exports: an ``NPLT`` folder in the user's documents folder
    (``XDG_DOCUMENTS_DIR``, else ``~/Documents``), never the current directory."""
    return platformdirs.user_documents_path() / "NPLT"

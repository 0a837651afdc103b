"""The user's folders the client reads and writes, from platformdirs (XDG respected on Linux).

- config: ``$XDG_CONFIG_HOME/nplt/client.toml`` (default ``~/.config/nplt/client.toml``)
- saved TUI state (theme, input history): ``$XDG_STATE_HOME/nplt/tui.json`` (``~/.local/state/nplt``)
- logs: ``$XDG_STATE_HOME/nplt/log/client.log``
- exports: an ``NPLT`` folder in the documents folder (``XDG_DOCUMENTS_DIR``, else ``~/Documents``)
"""
from __future__ import annotations

from pathlib import Path

import platformdirs

APP_NAME = "nplt"


def config_file() -> Path:
    """The client config file read when no ``--config`` / ``NPLT_CLIENT_CONFIG`` is given."""
    return platformdirs.user_config_path(APP_NAME) / "client.toml"


def state_file() -> Path:
    """What the TUI remembers between runs (the theme picked in the palette, the input history)."""
    return platformdirs.user_state_path(APP_NAME) / "tui.json"


def log_file() -> Path:
    """The TUI's log file (client library warnings: invalid frames, failed cancels, ...)."""
    return platformdirs.user_log_path(APP_NAME) / "client.log"


def export_dir() -> Path:
    """Where the TUI proposes to save exports: an ``NPLT`` folder in the user's documents folder
    (``XDG_DOCUMENTS_DIR``, else ``~/Documents``), never the current directory."""
    return platformdirs.user_documents_path() / "NPLT"

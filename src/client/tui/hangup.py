"""Notice that the TUI's terminal went away (SSH drop, closed tmux pane) so the app can exit.

Two signs, either is enough: SIGHUP, and a terminal that no longer answers (``tcgetattr`` fails with
EIO once the pseudo-terminal's other side is closed; reads then return EOF, on which Textual's
input thread would otherwise spin). The check costs one ioctl per ``CHECK_S``.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import termios
from typing import Callable

log = logging.getLogger(__name__)

CHECK_S = 1.0   # seconds between two terminal checks


def terminal_alive(fd: int) -> bool:
    """False once the terminal on ``fd`` has hung up."""
    try:
        termios.tcgetattr(fd)
    except (termios.error, OSError):
        return False
    return True


class TerminalWatch:
    """Calls ``on_gone(reason)`` once, on SIGHUP or when the terminal stops answering."""

    def __init__(self, on_gone: Callable[[str], None], fd: int | None = None) -> None:
        self.on_gone = on_gone
        self.fd = fd if fd is not None else _stdin_fd()
        self.watching_tty = self.fd is not None and terminal_alive(self.fd)  # not a terminal: nothing to check
        self._signal = False
        self._fired = False

    def install_signal(self) -> None:
        """Handle SIGHUP on the running loop (main thread only; elsewhere only the tty check runs)."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._gone, "SIGHUP")
            self._signal = True
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # not the main thread, or no signals
            log.debug("no SIGHUP handler: %s", exc)

    def remove_signal(self) -> None:
        if self._signal:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._signal = False

    def check(self) -> None:
        """Call periodically: fires when the terminal watched at start has hung up."""
        if self.watching_tty and self.fd is not None and not terminal_alive(self.fd):
            self._gone("the terminal hung up")

    def _gone(self, reason: str) -> None:
        if not self._fired:
            self._fired = True
            log.warning("exiting: %s", reason)
            self.on_gone(reason)


def _stdin_fd() -> int | None:
    stdin = sys.__stdin__
    try:
        return stdin.fileno() if stdin is not None else None
    except (OSError, ValueError):   # closed or replaced stdin: no terminal to watch
        return None

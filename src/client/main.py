"""``nplt-client``: the Textual TUI (no subcommand) or a scriptable subcommand (see docs/client.md)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import logging.handlers
import os
import signal
import sys
from importlib import metadata
from typing import Any, NoReturn, Sequence

from client import cli, paths
from client.wording import printable
from client.config import ClientConfig, ClientConfigError, add_arguments


LOG_BYTES = 1 << 20   # one log file; LOG_FILES older ones are kept
LOG_FILES = 3
NO_TERMINAL = "USAGE: the TUI needs a terminal: give a subcommand (nplt-client --help)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nplt-client",
        description="NPLT Assistant client: opens the TUI, or runs one subcommand for scripts.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 usage/config error, 3 connection error, "
               "4 authentication failed, 5 request rejected, 6 turn failed or cancelled, 130 interrupted "
               "(Ctrl+C), 143 terminated (SIGTERM), 129 hung up (SIGHUP).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    add_arguments(parser)
    cli.add_subcommands(parser)
    return parser


def version() -> str:
    """The installed package's version."""
    try:
        return metadata.version("nplt-assistant")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


def log_to_file() -> None:
    """The TUI owns the terminal: its log goes to a rotating file in the user's log folder."""
    path = paths.log_file()
    try:
        paths.private_dir(path.parent)
        handler = paths.PrivateRotatingFileHandler(path, maxBytes=LOG_BYTES, backupCount=LOG_FILES,
                                                   encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"nplt-client: cannot open the log file {path}: {exc}\n")
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


#: the loggers of the client library and the CLI (``client.*``; ``client.kb`` logs as ``nplt.client``)
CLIENT_LOGGERS = ("client", "nplt")


class CliLogHandler(logging.Handler):
    """The client library's log in a subcommand: its warnings (a connection taken as lost, a frame
    that did not validate) are not printed, because the command's own error line says what the user
    needs (``nplt-client: CONNECTION_LOST: ...``); before, Python's last-resort handler wrote them to
    stderr as bare lines, ahead of that error. What is logged at ERROR or above (a bug) is written as
    ``nplt-client: LEVEL: message`` (made printable: it may quote the server's text)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = printable(f"nplt-client: {record.levelname}: {record.getMessage()}")
            if record.exc_info:
                line += printable("\n" + self.formatException(record.exc_info))
            if sys.stderr is not None:
                sys.stderr.write(line + "\n")
        except Exception:      # (logging must never break the command)
            self.handleError(record)


def log_for_cli() -> None:
    """A subcommand prints to stdout/stderr itself: the client loggers get a ``CliLogHandler`` (once,
    on ``CLIENT_LOGGERS`` only: the root logger and other loggers are left as they are)."""
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, CliLogHandler) for h in logger.handlers):
            logger.addHandler(CliLogHandler())


def _on_terminal() -> bool:
    """Whether stdin and stdout are both a terminal (the TUI reads keys from one and draws on the other)."""
    try:
        return sys.stdin is not None and sys.stdout is not None and sys.stdin.isatty() and sys.stdout.isatty()
    except ValueError:   # a closed stream
        return False


#: Signals that stop a subcommand the way Ctrl+C does (a running ``ask`` turn is cancelled on the
#: server first), with their exit codes (128 + the signal's number, as a shell reports a kill)
STOP_SIGNALS = {sig: code for sig, code in ((getattr(signal, "SIGTERM", None), cli.EXIT_TERMINATED),
                                             (getattr(signal, "SIGHUP", None), cli.EXIT_HANGUP)) if sig is not None}
#: After a stop signal the cleanup (``ask`` cancelling its turn, at most ``cli.CANCEL_WAIT_S``, then
#: closing the connection) has this long; when something keeps it from ending (the main thread
#: blocked writing into a stdout nobody reads), the process ends anyway, with the signal's exit code.
STOP_DEADLINE_S = cli.CANCEL_WAIT_S + 3.0
#: How long the last flush of stdout may block when a stopped command ends the process (a stdout
#: nobody reads); what is still unwritten then is dropped.
EXIT_FLUSH_S = 1.0


class Terminated(Exception):
    """A subcommand stopped by one of ``STOP_SIGNALS``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def code(self) -> int:
        return STOP_SIGNALS.get(signal.Signals(self.signum), 128 + self.signum)


async def run_stoppable(args: argparse.Namespace, cfg: ClientConfig) -> int:
    """``cli.run_command``, cancelled by SIGTERM (``timeout``, ``kill``, systemd) or SIGHUP (the
    terminal closed) as asyncio cancels it on Ctrl+C, so the same cleanup runs (``ask`` cancels its
    turn, the connection is closed) before ``Terminated`` is raised (``main`` then ends the process
    without waiting for worker threads). The handler is a Python signal handler, as
    ``asyncio.Runner``'s for SIGINT: it runs in the main thread even while that thread is blocked in
    a write (a stdout nobody reads), which a callback of the blocked event loop would not, and arms
    ``STOP_DEADLINE_S``. Outside the main thread (tests calling ``main`` from a thread) no handler
    can be installed and the signals keep their default."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        if len(received) == 1:
            line = f"nplt-client: TERMINATED: {signal.Signals(signum).name}\n"
            _end_after(STOP_DEADLINE_S, Terminated(signum).code, line)
        loop.call_soon_threadsafe(task.cancel)   # again on a second signal: it also cuts the cleanup short
    installed: dict[int, Any] = {}     # signal -> the handler it had (put back: main() may run in-process)
    for sig in STOP_SIGNALS:
        try:
            installed[sig] = signal.signal(sig, on_signal)
        except (ValueError, OSError):   # not the main thread
            continue
    try:
        code = await cli.run_command(args, cfg)
    except asyncio.CancelledError:
        if received:
            raise Terminated(received[0]) from None
        raise
    finally:
        for sig, previous in installed.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
    if received:     # the cleanup ended otherwise (SIGHUP: the terminal gone, its last write failed)
        raise Terminated(received[0])
    return code


def _end_after(seconds: float, code: int, line: str) -> None:
    """In ``seconds``, end the process with ``code`` whatever it is doing, after writing ``line`` to
    stderr's descriptor (SIGALRM: its handler runs in the main thread even when that thread is
    blocked in a write). Where there is no ``setitimer`` (Windows), nothing is armed."""
    def overdue(_signum: int, _frame: Any) -> None:
        try:
            os.write(2, line.encode("utf-8", "replace"))   # (not sys.stderr: its lock may be held)
        except OSError:
            pass
        os._exit(code)
    if not hasattr(signal, "setitimer"):
        return
    try:
        signal.signal(signal.SIGALRM, overdue)
    except ValueError:      # not the main thread
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _end_now(code: int, line: str) -> NoReturn:
    """End the process with ``code`` once a stopped command's cleanup is done: stdout flushed (at
    most ``EXIT_FLUSH_S``), ``line`` on stderr, then ``os._exit``. Not the interpreter's normal exit:
    it, like ``asyncio.Runner.close``, waits for the worker threads, and a blocking call running in
    one cannot be cancelled (reading a stdin nobody closes for ``ask -``, writing into a FIFO nobody
    reads), so a stop signal would leave the process running."""
    _end_after(EXIT_FLUSH_S, code, line)
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        pass
    _say(line)
    os._exit(code)


def _say(text: str) -> None:
    """A last line on stderr, when there is still a stderr to take it (not after SIGHUP closed the terminal)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (``| head``): stop quietly. Later writes (the interpreter's final
    flush included) go to /dev/null instead of printing a BrokenPipeError traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return cli.EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = ClientConfig.load(args)
        cfg.tls.context()  # surface a bad CA file as a config error before connecting
    except ClientConfigError as exc:
        sys.stderr.write(f"nplt-client: CONFIG_ERROR: {exc}\n")
        return cli.EXIT_USAGE
    if not args.command:
        if not _on_terminal():   # a script or cron job that forgot the subcommand: refuse, do not draw
            sys.stderr.write(f"nplt-client: {NO_TERMINAL}\n")
            return cli.EXIT_USAGE
        from client.tui.app import NpltApp  # Textual is only imported for the TUI
        log_to_file()
        app = NpltApp(cfg)
        app.run()
        return app.return_code or cli.EXIT_OK
    log_for_cli()
    # not asyncio.run: its close waits for the worker threads, which a stopped command does not (_end_now)
    runner = asyncio.Runner()
    stopped: tuple[int, str] | None = None
    try:
        return runner.run(run_stoppable(args, cfg))
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        stopped = (cli.EXIT_INTERRUPTED, "nplt-client: INTERRUPTED\n")
    except Terminated as exc:
        stopped = (exc.code, f"nplt-client: TERMINATED: {exc}\n")
    finally:
        if stopped is None:
            runner.close()
    assert stopped is not None
    _end_now(*stopped)


if __name__ == "__main__":
    raise SystemExit(main())

"""``nplt-server``: parse the configuration, run the server until SIGINT/SIGTERM, shut down gracefully.

Exit codes: 0 after a clean shutdown, 2 for configuration errors (message on stderr), 1 when the
server cannot start (e.g. the port is in use, the data directory is locked, the log file cannot be
written). ``nplt-server hash-token [TOKEN]`` and ``nplt-server migrate-json-to-pg`` are subcommands.

The server logs to stderr until it holds its data directory (the store's lock), and only then to its
log file too, starting with what it logged before (``[server] log_startup_records``): a second server
refused the lock must not write into the log of the one running.

``main`` sets the process umask to ``SERVER_UMASK`` (077) before anything is created: the history,
the knowledge base, user memory, the log, the port file and every other file the server writes are
its account's only (files 0600, directories 0700), whatever the umask it was started with.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Callable

from server.auth import hash_token, token_problem
from server.cli import build_parser, config_from_args, default_log_file
from server.config import ServerConfig, check_bind_policy
from server.config_base import ConfigError
from server.logs import LogFile, StartupRecords, add_log_file, setup_logging
from server.services import VERSION
from storage import open_store

log = logging.getLogger("nplt.main")

#: the process umask while ``main`` runs: whatever the server creates is private to its account
SERVER_UMASK = 0o077


class LogFileError(Exception):
    """The log file cannot be written (exit code 1)."""


def _loop_factory():
    """uvloop's event loop when installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def tune_gc(gen0_threshold: int) -> None:
    """The process's garbage collector, once the server is built, just before it listens (its full
    collection takes ~1 s of a large process: no client waits on it then). Everything loaded so far
    (modules, config, the SDKs) lives as long as the process: it is kept out of the collector's full
    passes (~80k objects, ~20 ms of event-loop time each). And the young generation is collected
    every ``gen0_threshold`` allocations instead of Python's 700: a turn allocates thousands of
    short-lived objects, nearly all freed by reference counting, so the default collects several
    times a turn for nothing (bench/load.py: ~200 ms of a 1 s run went to the collector)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def freeze_young() -> None:
    """Once the knowledge base has loaded (after ``tune_gc``: the server listens meanwhile): its
    index's objects are kept out of the collector's full passes too, as what ``tune_gc`` froze. Only
    the young generations are collected first (the full pass is what a client would wait on)."""
    gc.collect(1)
    gc.freeze()


def hash_token_main(argv: list[str]) -> int:
    """``nplt-server hash-token [TOKEN]``: print the sha256 of a token for ``[auth] users``."""
    p = argparse.ArgumentParser(
        prog="nplt-server hash-token",
        description="Print the sha256 of an auth token, to put in [auth] users as token_sha256. Without "
                    "TOKEN the token is read from stdin (one line; keeps it out of the shell history).")
    p.add_argument("token", nargs="?", help="the token (default: read from stdin)")
    ns = p.parse_args(argv)
    token = ns.token
    if token is None:
        token = _read_token()
    problem = token_problem(token)
    if problem is not None:        # (empty, or longer than any HELLO accepts)
        print(f"nplt-server hash-token: {problem}", file=sys.stderr)
        return 2
    print(hash_token(token))
    return 0


def _read_token() -> str:
    """The token from stdin: typed at a terminal without echo (``getpass``), else one line of a pipe."""
    if sys.stdin is not None and sys.stdin.isatty():
        try:
            return getpass.getpass("nplt-server hash-token: type the token (not shown), then Enter: ")
        except EOFError:                 # (Ctrl-D: nothing typed)
            return ""
    if sys.stdin is None:
        print("nplt-server hash-token: no stdin to read the token from", file=sys.stderr, flush=True)
        return ""
    return sys.stdin.readline().rstrip("\r\n")


def start_error(exc: OSError, cfg: ServerConfig) -> str:
    """What an OSError that stopped the start means, in the operator's terms: a host name that does
    not resolve names the setting; a regular file where a directory belongs says so (instead of
    "[Errno 17] File exists")."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host {cfg.server.host!r} (server.host, --host): {exc.strerror or exc}"
    name = exc.filename if isinstance(exc.filename, str) else None
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and name:
        for p in (Path(name), *Path(name).parents):
            if p.exists() and not p.is_dir():
                return f"{p} must be a directory (found a file)"
    return str(exc)


def open_log_file(cfg: ServerConfig, earlier: StartupRecords | None = None) -> LogFile | None:
    """Log to the server's log file (``default_log_file``; None: off) as well, starting with the
    records ``earlier`` kept; LogFileError when it cannot be written."""
    path = default_log_file(cfg)
    if path is None:
        return None
    try:
        out = add_log_file(path, cfg.server.log_format, max_bytes=cfg.server.log_max_bytes,
                           backups=cfg.server.log_backups, earlier=earlier)
    except OSError as exc:
        raise LogFileError(f"cannot write the log file {path}: {exc}") from None
    print(f"nplt-server: logging to {out.path}", file=sys.stderr, flush=True)
    if earlier is not None and earlier.dropped:
        log.warning("%d records logged at start-up are on stderr only (server.log_startup_records = %d)",
                    earlier.dropped, cfg.server.log_startup_records)
    return out


async def serve(cfg: ServerConfig, port_file: str | None = None, stop: asyncio.Event | None = None,
                locked: Callable[[], None] | None = None) -> None:
    """Run a Server until ``stop`` is set (or SIGINT/SIGTERM arrives). The store is opened first
    (JSON: it takes the data directory's lock, StorageLocked if another server holds it), then
    ``locked`` is called (``main`` opens the log file there), then the server starts on that store."""
    from server.app import Server
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError) as exc:  # pragma: no cover - non-main thread / Windows
            log.debug("no handler for %s here (%s): stop only through the event", sig.name, exc)
    store = await open_store(cfg.storage)
    try:
        if locked is not None:
            locked()
        server = Server(cfg, store=store)
        host, port = await server.start(before_listening=lambda: tune_gc(cfg.server.gc_gen0_threshold))
        if server.knowledge_loaded is not None:    # its index lives as long as the process, too
            server.knowledge_loaded.add_done_callback(lambda _t: freeze_young())
        try:
            if port_file:
                tmp = Path(port_file + ".tmp")
                tmp.write_text(f"{port}\n")
                os.replace(tmp, port_file)
            print(f"nplt-server listening on {host}:{port}", file=sys.stderr, flush=True)
            log.info("history in %s", "PostgreSQL" if cfg.storage.url else os.path.abspath(cfg.storage.root))
            await stop.wait()
        finally:
            await server.stop()
    finally:
        await store.close()   # (after the server: it compacts the journals)


def main(argv: list[str] | None = None) -> int:
    old_umask = os.umask(SERVER_UMASK)        # before anything is created (restored for in-process callers)
    try:
        return _main(argv)
    finally:
        os.umask(old_umask)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "hash-token":
        return hash_token_main(argv[1:])
    if argv and argv[0] == "migrate-json-to-pg":
        from server.migrate import main as migrate_main
        return migrate_main(argv[1:])
    ns = build_parser(VERSION).parse_args(argv)
    try:
        cfg = config_from_args(ns, os.environ)
        check_bind_policy(cfg)
    except ConfigError as exc:
        print(f"nplt-server: configuration error: {exc}", file=sys.stderr)
        return 2
    setup_logging(cfg.server.log_level, cfg.server.log_format)   # stderr; the file once the store is locked
    earlier = StartupRecords(cfg.server.log_startup_records)    # ... and then what was logged before
    logging.getLogger().addHandler(earlier)
    log_files: list[LogFile] = []

    def locked() -> None:
        out = open_log_file(cfg, earlier)
        logging.getLogger().removeHandler(earlier)   # (taken off by open_log_file, or no log file)
        if out is not None:
            log_files.append(out)

    try:
        return _run(cfg, ns.port_file, locked)
    finally:
        logging.getLogger().removeHandler(earlier)
        for out in log_files:
            out.close()


def _run(cfg: ServerConfig, port_file: str | None, locked: Callable[[], None] | None = None) -> int:
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(cfg, port_file, locked=locked))
    except LogFileError as exc:
        print(f"nplt-server: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"nplt-server: configuration error: {exc}", file=sys.stderr)
        log.error("configuration error: %s", exc)
        return 2
    except OSError as exc:
        why = start_error(exc, cfg)
        print(f"nplt-server: cannot start: {why}", file=sys.stderr)
        log.error("cannot start: %s", why)
        return 1
    except Exception as exc:  # e.g. StorageLocked: another server uses the data directory
        print(f"nplt-server: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        log.error("cannot start: %s: %s", type(exc).__name__, exc)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

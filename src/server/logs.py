"""Logging set-up: human text lines or JSON lines, to stderr and to a rotating log file. Never log
tokens or message contents at info level.

The file is written by a ``QueueListener`` thread (stdlib ``logging.handlers``), so a slow disk never
stalls the event loop; ``RotatingFileHandler`` rotates it at ``max_bytes``, keeping ``backups`` files
(with 0 backups the file is cut instead: ``BoundedFileHandler``). ``nplt-server`` adds the file
(``add_log_file``) only once it holds its data directory (``server.main.serve``); what was logged
before (the store's recovery, say) is kept meanwhile by ``StartupRecords`` and written first.

The log file is created ``LOG_FILE_MODE`` (0600) and its directory ``LOG_DIR_MODE`` (0700): the log
names users, sessions and files, and is nobody else's to read.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
from collections import deque
from datetime import datetime, timezone

import orjson

#: mode of a log file the server creates (rotated files keep it)
LOG_FILE_MODE = 0o600
#: mode of the log file's directory when the server creates it
LOG_DIR_MODE = 0o700

#: HTTP client libraries whose INFO lines name every request's full URL (user info, ?api-key=... included:
#: the LLM base_url's secrets) and whose DEBUG lines trace every request: held at ``QUIET_LOGGER_LEVEL``
#: whatever the server's log_level (the server logs the endpoint itself, by host and port only)
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
QUIET_LOGGER_LEVEL = logging.WARNING

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus any ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def _formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class _InProcessQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the listener thread as they are (same process: no pickling), with the
    message merged eagerly so later changes to its arguments cannot show."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg, record.args = record.getMessage(), None
        return record


class StartupRecords(logging.Handler):
    """The records logged before the log file may be opened, the newest ``capacity`` of them, for
    ``add_log_file`` to write first; ``dropped`` counts the older ones left out."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.records: deque[logging.LogRecord] = deque(maxlen=capacity)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) == self.records.maxlen:
            self.dropped += 1
        self.records.append(record)


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CLOEXEC, LOG_FILE_MODE)


class BoundedFileHandler(logging.handlers.RotatingFileHandler):
    """``RotatingFileHandler`` that keeps the file under ``maxBytes`` with no backups too (the stdlib's
    never rolls over when ``backupCount`` is 0, so the file grew without bound): the older half of the
    file is cut, from a line start, and the newest lines are kept."""

    def _open(self):
        """The file, created ``LOG_FILE_MODE`` (the stdlib's would be 0666 less the umask)."""
        return self._builtin_open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors,
                                  opener=_private_opener)

    def doRollover(self) -> None:
        if self.backupCount > 0:
            super().doRollover()
            return
        if self.stream:
            self.stream.close()
            self.stream = None   # type: ignore[assignment]
        try:
            with open(self.baseFilename, "r+b") as f:
                start = max(0, f.seek(0, os.SEEK_END) - self.maxBytes // 2)
                f.seek(start)
                tail = f.read()
                if start:
                    tail = tail[tail.find(b"\n") + 1:]   # (no line end at all: the whole tail)
                f.seek(0)
                f.write(tail)
                f.truncate()
        except FileNotFoundError:   # removed meanwhile: started again
            pass
        if not self.delay:
            self.stream = self._open()


class LogFile:
    """The rotating log file and the thread that writes it; ``close`` flushes and stops it."""

    def __init__(self, path: str, fmt: str, max_bytes: int, backups: int) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), mode=LOG_DIR_MODE, exist_ok=True)
        handler = BoundedFileHandler(self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        handler.setFormatter(_formatter(fmt))
        q: queue.SimpleQueue = queue.SimpleQueue()
        self.handler = _InProcessQueueHandler(q)
        self.listener = logging.handlers.QueueListener(q, handler, respect_handler_level=False)
        self._file_handler = handler
        self.listener.start()

    def close(self) -> None:
        logging.getLogger().removeHandler(self.handler)
        self.listener.stop()
        self._file_handler.close()


def setup_logging(level: str = "info", fmt: str = "text", log_file: str | None = None, *,
                  max_bytes: int = 5 << 20, backups: int = 3) -> LogFile | None:
    """Configure the root logger once (replacing earlier handlers) to write to stderr and, when
    ``log_file`` is given, to that rotating file (the returned LogFile; close it at exit). An
    unwritable log file raises OSError."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(QUIET_LOGGER_LEVEL)
    if log_file is None:
        return None
    return add_log_file(log_file, fmt, max_bytes=max_bytes, backups=backups)


def add_log_file(path: str, fmt: str = "text", *, max_bytes: int = 5 << 20, backups: int = 3,
                 earlier: StartupRecords | None = None) -> LogFile:
    """Also log to the rotating file ``path`` (close the returned LogFile at exit), starting with the
    records ``earlier`` kept (it is taken off the root logger); OSError when it cannot be written."""
    out = LogFile(path, fmt, max_bytes, backups)
    root = logging.getLogger()
    if earlier is not None:
        root.removeHandler(earlier)
        for record in earlier.records:
            out.handler.handle(record)
        earlier.records.clear()
    root.addHandler(out.handler)
    return out

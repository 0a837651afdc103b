"""Logging set-up: human text lines or JSON lines, to stderr and to a rotating log file. Never log
tokens or message contents at info level.

The file is written by a ``QueueListener`` thread (stdlib ``logging.handlers``), so a slow disk never
stalls the event loop; ``RotatingFileHandler`` rotates it at ``max_bytes``, keeping ``backups`` files.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
from datetime import datetime, timezone

import orjson

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


class LogFile:
    """The rotating log file and the thread that writes it; ``close`` flushes and stops it."""

    def __init__(self, path: str, fmt: str, max_bytes: int, backups: int) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(self.path, maxBytes=max_bytes, backupCount=backups,
                                                       encoding="utf-8")
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
    if log_file is None:
        return None
    out = LogFile(log_file, fmt, max_bytes, backups)
    root.addHandler(out.handler)
    return out

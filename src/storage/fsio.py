"""Small file helpers: durable atomic writes, directory fsync, whole-file reads, quarantine moves."""
from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime, timezone

log = logging.getLogger("storage")

QUARANTINE_DIR = "quarantine"


def fsync_dir(path: str) -> None:
    """fsync a directory so renames and new entries in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: fdatasync where the platform has it (file data and the size, not the other metadata); the journal
#: and the WAL call it as ``fsio.datasync`` so that tests can intercept every data sync in one place
datasync = getattr(os, "fdatasync", os.fsync)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path: str, data: bytes, *, sync: bool = False) -> None:
    """Create/replace ``path`` with ``data`` (and fsync it when ``sync``; not atomic by itself)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_file_synced(path: str, data: bytes) -> None:
    """Create/replace ``path`` with ``data`` and fsync it (not atomic by itself)."""
    write_file(path, data, sync=True)


def atomic_write(path: str, data: bytes, *, sync: bool = True) -> None:
    """Write ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path + ".tmp"
    try:
        if sync:
            write_file_synced(tmp, data)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def quarantine(root: str, path: str, *, copy: bool = False, reason: str = "") -> str | None:
    """Move (or copy) ``path`` into ``<root>/quarantine/`` under a unique name; never overwrites."""
    if not os.path.exists(path):
        return None
    qdir = os.path.join(root, QUARANTINE_DIR)
    os.makedirs(qdir, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    base = os.path.join(qdir, f"{os.path.basename(path)}.{stamp}")
    dest, n = base, 1
    while os.path.exists(dest):
        dest, n = f"{base}.{n}", n + 1
    if copy:
        shutil.copyfile(path, dest)
    else:
        os.replace(path, dest)
    fsync_dir(qdir)
    if not copy:
        fsync_dir(root)
    log.error("storage: %s %s to %s%s", "copied" if copy else "moved", path, dest,
              f" ({reason})" if reason else "")
    return dest

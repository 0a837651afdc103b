"""Small file helpers: durable atomic writes, directory fsync, whole-file reads, quarantine moves.

The store opens its own files by name only through ``open_regular``: never through a symbolic link
(``O_NOFOLLOW``) and never anything but a regular file (``fstat``), so a file of the root replaced
by a link to a file elsewhere is refused (``NotRegularFile``), never read, written or truncated.

Everything the store creates is private to the server's account: files ``FILE_MODE`` (0600),
directories ``DIR_MODE`` (0700), whatever the process umask (``nplt-server`` also sets umask 077).
"""
from __future__ import annotations

import errno
import logging
import os
import resource
import shutil
import stat
import threading
from collections.abc import Callable
from datetime import datetime, timezone

log = logging.getLogger("storage")

QUARANTINE_DIR = "quarantine"

#: mode of every file the store creates (owner read/write only: history is private)
FILE_MODE = 0o600
#: mode of every directory the store creates (owner only)
DIR_MODE = 0o700


class NotRegularFile(OSError):
    """A file of the store is a symbolic link or not a regular file: refused, never followed."""


#: callbacks that free descriptors (a store's: close its idle journals), called when an open fails
#: for want of them (EMFILE, ENFILE); each returns how many it closed
_relievers: list[Callable[[], int]] = []
_relievers_lock = threading.Lock()


def add_reliever(fn: Callable[[], int]) -> None:
    with _relievers_lock:
        _relievers.append(fn)


def remove_reliever(fn: Callable[[], int]) -> None:
    with _relievers_lock:
        if fn in _relievers:
            _relievers.remove(fn)


def relieve(exc: OSError) -> int:
    """Out of descriptors: ask every reliever to close what it can spare; how many were closed."""
    with _relievers_lock:
        relievers = list(_relievers)
    freed = sum(fn() for fn in relievers)
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        soft = -1
    log.warning("storage: out of file descriptors (%s; the process may open %d): closed %d idle journal "
                "files and retrying; raise the limit (ulimit -n, systemd LimitNOFILE=) or lower "
                "[storage] lru_size", exc.strerror or exc, soft, freed)
    return freed


def os_open(path: str, flags: int, mode: int = 0o777) -> int:
    """``os.open``; when it fails for want of descriptors (EMFILE, ENFILE), idle journals are
    closed (``relieve``) and it is tried once more."""
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE) or not relieve(exc):
            raise
    return os.open(path, flags, mode)


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = FILE_MODE) -> int:
    """``os.open`` that refuses a symbolic link and anything but a regular file (NotRegularFile).
    (O_NONBLOCK: opening a FIFO must not block; it is cleared again once the file is known regular.)"""
    try:
        fd = os_open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "is a symbolic link", path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "is not a regular file", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: str) -> None:
    """fsync a directory so renames and new entries in it are durable."""
    fd = os_open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
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
        write_file(tmp, data, sync=sync)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def read_regular(path: str) -> tuple[bytes, os.stat_result]:
    """The whole content of the regular file ``path`` and its ``fstat`` (one open: they match)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read(), os.fstat(f.fileno())


def read_bytes(path: str) -> bytes:
    return read_regular(path)[0]


def quarantine(root: str, path: str, *, copy: bool = False, reason: str = "") -> str | None:
    """Move (or copy) ``path`` into ``<root>/quarantine/`` under a unique name; never overwrites.
    A symbolic link (or any file that is not regular) is always moved, the link itself: its target
    is never copied."""
    if not os.path.lexists(path):
        return None
    qdir = os.path.join(root, QUARANTINE_DIR)
    os.makedirs(qdir, mode=DIR_MODE, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    base = os.path.join(qdir, f"{os.path.basename(path)}.{stamp}")
    dest, n = base, 1
    while os.path.lexists(dest):
        dest, n = f"{base}.{n}", n + 1
    if copy:
        try:
            src = os.fdopen(open_regular(path), "rb")
        except NotRegularFile:
            copy = False
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with src, os.fdopen(os_open(dest, flags, FILE_MODE), "wb") as out:
                shutil.copyfileobj(src, out)
    if not copy:
        os.replace(path, dest)
    fsync_dir(qdir)
    if not copy:
        fsync_dir(root)
    log.error("storage: %s %s to %s%s", "copied" if copy else "moved", path, dest,
              f" ({reason})" if reason else "")
    return dest

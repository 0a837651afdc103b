"""Local files the client writes for an export (``nplt-client export --output``, the TUI's ctrl+s):
where it goes, and writing it without ever leaving a cut-off file.

Where (``export_target``), by the rules of ``kb download -o`` (docs/client.md): a path that is an
existing folder means ``nplt-<session id>.<md|json>`` in it (as ``cp`` does); a path ending in a
separator names a folder, so when no such folder exists it is WRITE_FAILED ("not a folder"), never a
file of that name; a folder where the file would go is WRITE_FAILED ("it is a folder").

How (``write_export``): a regular file (existing or not) is written to a temporary file beside it
(``TEMP_PREFIX``, a short name whatever the target's, created with the umask's permissions, or
given the replaced file's), flushed to disk (fsync), then renamed over it (``os.replace``, atomic):
a write that fails (a full disk, a file size limit, an I/O error) leaves the old file as it was (or
no file), and the temporary file is removed. A symlink to a regular file replaces its target (the
link stays a link). A FIFO, a device or a descriptor's alias (``/dev/stdout``) is written through in
place, as ``kb download`` does (``client.kb``: ``write_target`` decides, ``open_stream`` opens):
it cannot be renamed over.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
from pathlib import Path

from client import kb as kbclient
from client.errors import ClientCode, ClientError

#: an export format's file extension (the default file name in a folder: ``nplt-<session>.<ext>``)
EXPORT_EXTENSIONS = {"markdown": "md", "json": "json"}
#: the temporary file an export is written to before it is renamed over the target:
#: ``.nplt-<16 hex digits>.tmp`` beside it (short, so a target name of 255 bytes still has a temp)
TEMP_PREFIX, TEMP_SUFFIX = ".nplt-", ".tmp"
#: how many temporary names are tried when one is taken (by another export at the same moment)
TEMP_TRIES = 16
SEPARATORS = kbclient.SEPARATORS   # a destination ending in one names a folder


def export_name(session_id: str, fmt: str) -> str:
    """The file name an export of ``session_id`` gets in a folder: ``nplt-<session id>.<ext>``."""
    return f"nplt-{Path(session_id).name}.{EXPORT_EXTENSIONS.get(fmt, fmt)}"


def export_target(raw: str | os.PathLike[str], default_name: str) -> Path:
    """Where an export asked for ``raw`` goes (blocking: it looks at the file system): ``raw``; for
    an existing folder (or a symlink to one) ``default_name`` in it. WRITE_FAILED for a ``raw``
    ending in a separator that is no existing folder, and for a folder where the file would go."""
    text = os.fspath(raw)
    dest = Path(text)
    if dest.is_dir():
        dest = dest / default_name
        if dest.is_dir():
            raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {dest}: it is a folder")
        return dest
    if text.endswith(SEPARATORS):
        raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {text}: not a folder")
    return dest


def replaces_a_file(dest: Path) -> bool:
    """Whether writing ``dest`` replaces an existing regular file (or a symlink's regular target):
    the TUI asks first. A FIFO or a device is written through, not replaced (blocking)."""
    try:
        return stat.S_ISREG(dest.stat().st_mode)
    except OSError:
        return False


async def write_export(dest: Path, data: bytes) -> None:
    """Write ``data`` to ``dest``: atomically for a regular file (``replace_atomically``), in place
    for a FIFO, a device or a descriptor's alias (waiting for a FIFO's reader, cancellable). An
    OSError (ENOSPC, EFBIG, EACCES, ...) is raised as it is, with nothing cut-off left behind."""
    target, direct, fd = await asyncio.to_thread(kbclient.write_target, dest)
    if not direct:
        await asyncio.to_thread(replace_atomically, target, data)
        return
    f = await kbclient.open_stream(target, fd)
    try:
        await asyncio.to_thread(_write_and_close, f, data)
    except BaseException:
        with contextlib.suppress(OSError, ValueError):
            f.close()
        raise


def _write_and_close(f: object, data: bytes) -> None:
    f.write(data)          # type: ignore[attr-defined]
    f.close()              # type: ignore[attr-defined]   (flushes: a FIFO whose reader left fails here)


def replace_atomically(dest: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file in ``dest``'s folder, fsync it, rename it over ``dest``
    and fsync the folder (blocking). On any failure the temporary file is removed and ``dest`` is as
    it was. A replaced file's permission bits are kept; a new file gets the umask's."""
    folder = dest.parent
    try:
        mode: int | None = stat.S_IMODE(dest.stat().st_mode)
    except FileNotFoundError:
        mode = None
    tmp, fd = _create_temp(folder)
    try:
        try:
            _write_all(fd, data)
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(folder)


def _create_temp(folder: Path) -> tuple[Path, int]:
    """A new temporary file in ``folder`` (``TEMP_PREFIX``...; mode 0666 less the umask) and its
    descriptor, open for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(TEMP_TRIES - 1):
        tmp = folder / f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
    tmp = folder / f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
    return tmp, os.open(tmp, flags, 0o666)


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd``, a block (``client.kb.BLOCK``) at a time."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:kbclient.BLOCK]):]


def _sync_folder(folder: Path) -> None:
    """Make the rename durable (best effort: not every file system lets a folder be fsynced)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

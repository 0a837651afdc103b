"""A v2 upload whose connection closes before the last byte is discarded at once: its ``.part`` file is
removed and closed, its buffer freed and nothing keeps the connection alive. (Before, it was held until
``v2_upload_timeout_s`` after the client had gone: a flood of clients that opened uploads and left kept
thousands of open files and connections, uncounted by ``max_clients``.) A v2 upload cannot be resumed
by another connection (the state is the connection's), so there is nothing to keep."""
from __future__ import annotations

import gc
import json
import logging
import os
import socket
import struct
import threading
import weakref
from pathlib import Path

import pytest

import server.legacy_v2_files as files
from server.auth import LOCAL_USER
from testkit.server import poll
from v2files_testlib import FILE_DATA, FILE_METADATA, connect, files_server, send_file

CLIENTS = 12
PIECE, PIECES = 65_000, 4           # 260,000 bytes: below the default 256 KiB flush point, all in memory
ANNOUNCED = 10 * 1024 * 1024


def _incoming(tmp_path: Path) -> list[Path]:
    d = tmp_path / "history" / "v2-uploads"
    return list(d.iterdir()) if d.exists() else []


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _received() -> list[int]:
    return [s.upload.received for s in list(files._STATE.values()) if s.upload is not None]


def _reset(v2) -> None:
    """Close with an RST (SO_LINGER 0), as a client that is killed or a flood script does."""
    sock = v2.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    v2.writer.transport.abort()


async def test_uploads_of_clients_that_leave_are_discarded_at_once(tmp_path: Path) -> None:
    async with files_server(tmp_path, transfer={"v2_upload_timeout_s": 600.0},   # far beyond the test
                            knowledge={"max_upload_bytes": 2 * ANNOUNCED, "max_uploads_per_user": CLIENTS}) as (srv, addr):
        # warm-up: one complete upload, so what the server opens lazily is in the baseline
        v2 = await connect(addr, udp_port=40000, early=True)
        send_file(v2, "warm.txt", b"warm-up document\n")
        assert (await v2.recv_text()).startswith("文件上传成功: ")
        await v2.close()
        await poll(lambda: not srv.services.connections and not _incoming(tmp_path))
        baseline = _open_fds()

        clients = []
        for k in range(CLIENTS):
            v2 = await connect(addr, udp_port=40001 + k, early=True)
            v2.send(FILE_METADATA, json.dumps({"filename": f"big-{k}.txt", "size": ANNOUNCED}))
            for _ in range(PIECES):
                v2.send(FILE_DATA, b"x" * PIECE)
            clients.append(v2)
        await poll(lambda: sorted(_received()) == [PIECE * PIECES] * CLIENTS, what="every upload's bytes in")
        assert len(_incoming(tmp_path)) == CLIENTS
        conns = [weakref.ref(c) for c in srv.services.connections]
        assert len(conns) == CLIENTS
        for k, v2 in enumerate(clients):
            if k % 2:
                _reset(v2)
            else:
                await v2.close()           # FIN: the server answers what was sent, then closes
        clients.clear()

        await poll(lambda: not srv.services.connections, what="every connection closed")
        await poll(lambda: _incoming(tmp_path) == [], timeout=5.0, what="no .part file left")
        await poll(lambda: _open_fds() <= baseline, timeout=5.0, what=f"open fds back to {baseline}")
        assert _received() == []

        def released() -> bool:
            gc.collect()
            return all(r() is None for r in conns)
        await poll(released, timeout=5.0, what="no ServerConnection alive")
        assert [d.name for d in await srv.services.knowledge.list(LOCAL_USER, ())] == ["warm.txt"]


async def test_a_client_that_leaves_while_the_file_is_being_created_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection closes while FILE_METADATA's file is still being created (in a worker thread)."""
    created, release = threading.Event(), threading.Event()
    original = files._create

    def held_create(directory: Path):          # (in the worker thread) held until the client has gone
        result = original(directory)
        created.set()
        release.wait(10)
        return result

    monkeypatch.setattr(files, "_create", held_create)
    async with files_server(tmp_path, transfer={"v2_upload_timeout_s": 600.0}) as (srv, addr):
        v2 = await connect(addr, udp_port=40000, early=True)
        ref = weakref.ref(next(iter(srv.services.connections)))
        try:
            v2.send(FILE_METADATA, json.dumps({"filename": "late.txt", "size": 1000}))
            await poll(created.is_set, what="the upload's file created")
            assert len(_incoming(tmp_path)) == 1
            _reset(v2)
            await poll(lambda: not srv.services.connections, what="the connection closed")
        finally:
            release.set()
        await poll(lambda: _incoming(tmp_path) == [], timeout=5.0, what="no .part file left")
        assert _received() == []

        def released() -> bool:
            gc.collect()
            return ref() is None
        await poll(released, timeout=5.0, what="the ServerConnection released")


class _HeldFile:
    """An upload's file whose writes wait (in the worker thread) until ``release`` is set."""

    def __init__(self, f, writing: threading.Event, release: threading.Event) -> None:
        self.f, self.writing, self.release = f, writing, release
        self.busy = self.closed_mid_write = False

    def write(self, data: bytes) -> int:
        self.busy = True
        self.writing.set()
        self.release.wait(10)
        try:
            return self.f.write(data)
        finally:
            self.busy = False

    def close(self) -> None:
        self.closed_mid_write |= self.busy
        self.f.close()


async def test_a_client_that_leaves_during_a_write_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The connection closes while a buffered piece is being written: the file is closed after that
    write (not under it), removed, and the request worker ends without an error."""
    caplog.set_level(logging.INFO)
    writing, release = threading.Event(), threading.Event()
    held: list[_HeldFile] = []
    original = files._create

    def held_create(directory: Path):
        path, f = original(directory)
        held.append(_HeldFile(f, writing, release))
        return path, held[-1]

    monkeypatch.setattr(files, "_create", held_create)
    async with files_server(tmp_path, transfer={"v2_upload_timeout_s": 600.0, "v2_upload_buffer_bytes": 4096}
                            ) as (srv, addr):
        v2 = await connect(addr, udp_port=40000, early=True)
        ref = weakref.ref(next(iter(srv.services.connections)))
        try:
            v2.send(FILE_METADATA, json.dumps({"filename": "mid.txt", "size": 100_000}))
            v2.send(FILE_DATA, b"y" * 5000)                 # over the 4096-byte buffer: a write starts
            await poll(writing.is_set, what="a write in progress")
            _reset(v2)
            await poll(lambda: not srv.services.connections, what="the connection closed")
        finally:
            release.set()
        await poll(lambda: _incoming(tmp_path) == [], timeout=5.0, what="no .part file left")
        assert held[0].f.closed and not held[0].closed_mid_write and _received() == []

        def released() -> bool:
            gc.collect()
            return ref() is None
        await poll(released, timeout=5.0, what="the ServerConnection released")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("nplt")]

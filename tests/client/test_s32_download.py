"""``kb download -o PATH`` onto what is not a regular file writes through it, as ``curl -o`` does:
a symlink's target gets the bytes (the link stays a link), a FIFO or a descriptor's alias
(``/dev/fd/N``) gets them streamed in order and still exists afterwards. Before, the client wrote
``PATH.part`` and renamed it over ``PATH``: the link, the FIFO (and, as root, ``/dev/stdout``) were
replaced by a regular file. Real server over loopback, the client library's ``download``."""
from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest

from client import kb as kbclient
from client.connection import Client
from client.errors import ClientError
from kb_wire.kbwire import kb_server, token

DOC = b"".join(f"{i:06d} backup of volume {i % 23} finished in {i % 97} s\n".encode() for i in range(8_000))
JOIN_S = 30.0


class PipeReader:
    """Reads a pipe to its end in a thread (the pipe buffer holds 64 KiB: the writer needs a reader)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data = fd, bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while block := os.read(self.fd, 1 << 16):
            self.data += block

    def result(self) -> bytes:
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "the reader never saw the end of the pipe"
        os.close(self.fd)
        return bytes(self.data)


async def _stored(c: Client, tmp_path: Path):
    src = tmp_path / "backup.log"
    src.write_bytes(DOC)
    return await kbclient.upload(c, src)


def _leftovers(*dirs: Path) -> list[str]:
    return sorted(p.name for d in dirs for p in d.iterdir() if p.name.endswith((".part", ".part.json")))


async def test_a_symlink_destination_writes_its_target_and_stays_a_link(tmp_path):
    work = tmp_path / "work"
    (work / "repo").mkdir(parents=True)
    (work / "repo" / "runbook.txt").write_text("old content\n")
    link = work / "link.txt"
    link.symlink_to("repo/runbook.txt")                  # relative, as `ln -s` makes it
    dangling = work / "new-link.txt"
    dangling.symlink_to("repo/not-yet.txt")              # a link to nothing yet: curl creates its target
    async with kb_server(tmp_path) as (_srv, addr):
        async with Client(*addr, token=token("alice")) as c:
            doc = await _stored(c, tmp_path)
            got = await kbclient.download(c, doc.doc_id, link)
            assert got.md5 == hashlib.md5(DOC).hexdigest()
            assert link.is_symlink() and os.readlink(link) == "repo/runbook.txt"
            assert (work / "repo" / "runbook.txt").read_bytes() == DOC
            await kbclient.download(c, doc.doc_id, dangling)
            assert dangling.is_symlink() and os.readlink(dangling) == "repo/not-yet.txt"
            assert (work / "repo" / "not-yet.txt").read_bytes() == DOC
    assert _leftovers(work, work / "repo") == []


async def test_a_fifo_destination_gets_every_byte_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe1"
    os.mkfifo(fifo)
    # held open read-write: neither side's open waits for the other, and the reader sees the end of
    # the stream only once this is closed (so a client that never writes into the FIFO fails the
    # assertion below instead of hanging the test)
    keep = os.open(fifo, os.O_RDWR)
    reader = PipeReader(os.open(fifo, os.O_RDONLY))
    try:
        async with kb_server(tmp_path) as (_srv, addr):
            async with Client(*addr, token=token("alice")) as c:
                doc = await _stored(c, tmp_path)
                got = await kbclient.download(c, doc.doc_id, fifo)
                assert got.doc_id == doc.doc_id
    finally:
        os.close(keep)
    assert reader.result() == DOC
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _leftovers(tmp_path) == []


async def test_a_descriptor_alias_is_written_through(tmp_path):
    """``-o /dev/stdout`` is ``/dev/fd/1``'s case: an alias of an open descriptor (here a pipe's
    write end) gets the bytes; nothing is created next to it."""
    r, w = os.pipe()
    reader = PipeReader(r)
    try:
        async with kb_server(tmp_path) as (_srv, addr):
            async with Client(*addr, token=token("alice")) as c:
                doc = await _stored(c, tmp_path)
                await kbclient.download(c, doc.doc_id, f"/dev/fd/{w}")
    finally:
        os.close(w)
    assert reader.result() == DOC


async def test_a_descriptor_on_a_regular_file_gets_the_bytes_at_its_offset(tmp_path):
    """``-o /dev/stdout > out.txt``: the descriptor behind the alias is written at its own offset,
    so what the program wrote before and writes after stays in order around the bytes (reopening
    the alias would write from offset 0, and the program's next line would overwrite the start)."""
    out = tmp_path / "out.txt"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"before\n")
        async with kb_server(tmp_path) as (_srv, addr):
            async with Client(*addr, token=token("alice")) as c:
                doc = await _stored(c, tmp_path)
                await kbclient.download(c, doc.doc_id, Path(f"/proc/self/fd/{fd}"))
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    assert out.read_bytes() == b"before\n" + DOC + b"after\n"
    assert _leftovers(tmp_path) == []


async def test_bytes_streamed_into_a_fifo_are_checked_after_the_fact(tmp_path):
    """A stream cannot be taken back: the md5 is checked once every byte is written, and a mismatch
    is CHECKSUM_MISMATCH (the FIFO stays)."""
    fifo = tmp_path / "pipe2"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR)
    reader = PipeReader(os.open(fifo, os.O_RDONLY))
    bad = DOC.replace(b"backup", b"BACKUP", 1)
    try:
        async with kb_server(tmp_path) as (srv, addr):
            async with Client(*addr, token=token("alice")) as c:
                doc = await _stored(c, tmp_path)
                original = srv.services.knowledge.store.path(doc.collection, doc.doc_id) / "original"
                original.write_bytes(bad)                 # the stored bytes changed behind the server
                with pytest.raises(ClientError) as exc:
                    await kbclient.download(c, doc.doc_id, fifo)
                assert exc.value.code == "CHECKSUM_MISMATCH" and "pipe2" in exc.value.message
    finally:
        os.close(keep)
    assert reader.result() == bad
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_the_cli_downloading_to_stdout_keeps_its_summary_off_stdout(tmp_path: Path) -> None:
    """``kb download DOC -o -`` (and ``-o /dev/stdout``) writes the document's bytes to stdout and its
    summary line to stderr, so ``> copy`` holds exactly the document."""
    import subprocess
    import sys as _sys
    from client_testlib import ServerThread
    data = b"# Runbook\n\nRestart the worker.\n" * 50
    src = tmp_path / "runbook.md"
    src.write_bytes(data)
    with ServerThread(tmp_path / "srv") as st:
        base = [_sys.executable, "-m", "client.main", "--host", st.addr[0], "--port", str(st.addr[1])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(_sys.path)}
        up = subprocess.run([*base, "kb", "upload", str(src)], capture_output=True, env=env, timeout=60)
        assert up.returncode == 0, up.stderr
        for target in ("-", "/dev/stdout"):
            out = tmp_path / f"copy{len(target)}"
            with open(out, "wb") as fh:
                got = subprocess.run([*base, "kb", "download", "runbook.md", "-o", target], stdout=fh,
                                     stderr=subprocess.PIPE, env=env, timeout=60)
            assert got.returncode == 0, got.stderr
            assert out.read_bytes() == data
            assert b"bytes  md5 " in got.stderr

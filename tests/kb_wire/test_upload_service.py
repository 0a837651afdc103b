"""UploadService flow control, deterministically: unwritten bytes over upload_buffer_bytes pause the
connection's reading; the writer (a worker thread) resumes it; a connection that leaves frees its slot
and keeps the bytes for a resume."""
from __future__ import annotations

import hashlib

from protocol import MsgType
from protocol.binary import MAX_DATA, encode_data
from server.handlers.knowledge_uploads import UploadService
from server.knowledge.config import KnowledgeConfig
from testkit.server import poll


class Port:
    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.errors: list[tuple] = []

    def send(self, msg_type: int, body: dict) -> None:
        self.sent.append((msg_type, body))

    def send_error(self, re, code, message) -> None:
        self.errors.append((code, message))


class Flow:
    def __init__(self) -> None:
        self.log: list[str] = []

    def pause_reading(self) -> None:
        self.log.append("pause")

    def resume_reading(self) -> None:
        self.log.append("resume")


async def test_reading_pauses_over_the_buffer_and_resumes_when_written(tmp_path):
    cfg = KnowledgeConfig()
    cfg.upload_buffer_bytes = 1 << 16
    svc = UploadService(cfg, tmp_path / "uploads")
    await svc.start()
    port, flow = Port(), Flow()
    data = bytes(range(256)) * 1024                       # 256 KiB
    begin = await svc.begin(port, 1, "alice", "user:alice", "a.txt", len(data), hashlib.md5(data).hexdigest(), None)
    for off in range(0, len(data), MAX_DATA):             # one read holding every frame: no await between
        svc.on_data(port, encode_data(begin.handle, off, data[off:off + MAX_DATA]), flow)
    assert flow.log[0] == "pause"
    await poll(lambda: "resume" in flow.log)
    up = await svc.finish(port, begin.upload_id)
    assert up.part.read_bytes() == data and not port.errors
    last = [b for t, b in port.sent if t == MsgType.KB_PROGRESS][-1]
    assert last["done"] == last["total"] == len(data) and last["re"] == 1
    await svc.remove(up)
    await svc.close()


async def test_a_connection_that_leaves_frees_its_slot_and_keeps_its_bytes(tmp_path):
    cfg = KnowledgeConfig()
    cfg.max_uploads = 1
    svc = UploadService(cfg, tmp_path / "uploads")
    await svc.start()
    data = b"x" * 100_000
    md5 = hashlib.md5(data).hexdigest()
    port = Port()
    begin = await svc.begin(port, 1, "alice", "user:alice", "a.txt", len(data), md5, None)
    svc.on_data(port, encode_data(begin.handle, 0, data[:MAX_DATA]), Flow())
    svc.detach_port(port)
    assert svc.in_progress() == 0
    again = await svc.begin(Port(), 2, "alice", "user:alice", "a.txt", len(data), md5, None)
    assert again.upload_id == begin.upload_id and again.offset == MAX_DATA
    await svc.close()


async def test_the_same_upload_begun_again_while_it_is_being_stored_waits_for_it(tmp_path):
    import asyncio
    svc = UploadService(KnowledgeConfig(), tmp_path / "uploads")
    await svc.start()
    port, flow, data = Port(), Flow(), b"hello world\n" * 100
    md5 = hashlib.md5(data).hexdigest()
    begin = await svc.begin(port, 1, "alice", "user:alice", "a.txt", len(data), md5, None)
    svc.on_data(port, encode_data(begin.handle, 0, data), flow)
    up = await svc.finish(port, begin.upload_id)           # the ingest would read up.part now
    waiting = asyncio.Event()

    class Watched(asyncio.Event):                          # the END's "ended" event, telling when waited on
        async def wait(self) -> bool:
            waiting.set()
            return await super().wait()
    svc._ended[up.upload_id] = Watched()
    again = asyncio.ensure_future(svc.begin(Port(), 2, "alice", "user:alice", "a.txt", len(data), md5, None))
    await asyncio.wait_for(waiting.wait(), 10)             # (a client that resumed on another connection)
    assert not again.done() and up.part.read_bytes() == data      # the file being parsed is left alone
    await svc.remove(up)                                   # the END is over: the BEGIN goes on, as a new upload
    reply = await asyncio.wait_for(again, 10)
    assert reply.offset == 0 and up.part.exists()          # its own file, not deleted by the END's removal
    await svc.close()

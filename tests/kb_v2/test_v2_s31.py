"""v2 downloads and uploads (review s31): a download that keeps moving keeps its connection alive, a
short read never sends a short packet nor completes, names are compared in NFC (stored as given), and a duplicate
upload says under which name its bytes are stored."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from protocol import ErrorCode
from server.auth import LOCAL_USER
from server.errors import HandlerError
from server.knowledge import DocumentInfo
from server.knowledge.pg_store import PgBlockReader
from server.offers import OfferService
from server.transfer_config import TransferConfig
from server.udp_transfer import DATA_BYTES, HEADER, UdpTransfer, packet_count
from storage import StorageUnavailable
from storage.pg.documents import BLOCK_BYTES
from rdt_receiver import LossyReceiver, ack_packet
from testkit.server import poll
from v2files_testlib import answer_with_offers, connect, files_server, send_file


class PacedReceiver(asyncio.DatagramProtocol):
    """A slow but steady v2 receiver: it keeps the in-order packets (receive window 5) and sends its
    cumulative ACK only every ``interval`` seconds, so a download of N packets takes about
    N / 5 * ``interval`` seconds, every ACK moving the window."""

    def __init__(self, size: int, interval: float) -> None:
        self.total = packet_count(size)
        self.interval = interval
        self.expected = 0
        self.window: dict[int, bytes] = {}
        self.parts: list[bytes] = []
        self.acked = -1
        self.peer: tuple[str, int] | None = None
        self.transport: asyncio.DatagramTransport | None = None
        self.complete = asyncio.Event()
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    async def open(cls, size: int, interval: float) -> tuple[PacedReceiver, int]:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_datagram_endpoint(lambda: cls(size, interval),
                                                               local_addr=("127.0.0.1", 0))
        return proto, transport.get_extra_info("sockname")[1]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.peer = addr
        seq, _ = HEADER.unpack_from(data)
        if self.expected <= seq < self.expected + 5:
            self.window[seq] = data[HEADER.size:]
            while self.expected in self.window:
                self.parts.append(self.window.pop(self.expected))
                self.expected += 1
        if self.expected == self.total:
            self.complete.set()

    def _tick(self) -> None:
        if self.expected - 1 > self.acked and self.transport is not None and self.peer is not None:
            self.acked = self.expected - 1
            self.transport.sendto(ack_packet(self.acked), self.peer)
        self.timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def md5(self) -> str:
        return hashlib.md5(b"".join(self.parts)).hexdigest()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()


# -- 1. ACK progress counts as the connection's activity -----------------------------------------------
async def test_a_download_still_moving_is_not_cut_by_the_idle_timeout(tmp_path: Path) -> None:
    """idle_timeout_s = 1 s, a download of ~2.5 s, the client silent on TCP (it is receiving): the
    download completes on an open connection; once it is over, the silent connection idles out."""
    body = b"".join(b"paced download line %08d\n" % i for i in range(250 * DATA_BYTES // 28))
    rx, udp_port = await PacedReceiver.open(len(body), interval=0.05)
    try:
        async with files_server(tmp_path, limits={"idle_timeout_s": 1.0, "ping_interval_s": 0.5},
                                transfer={"udp_give_up_s": 5}) as (srv, addr):
            await srv.services.knowledge.ingest(LOCAL_USER, (), None, "paced.txt", body)
            v2 = await connect(addr, udp_port=udp_port, early=True)
            [conn] = srv.services.connections
            v2.send(0x01, "download paced.txt")
            _, offers = await answer_with_offers(v2)
            [offer] = offers
            [transfer] = srv.services.udp.transfers.values()
            loop = asyncio.get_running_loop()
            started = loop.time()
            outcome = await asyncio.wait_for(transfer.done, 30)
            took = loop.time() - started
            assert outcome == "complete" and not conn.closing, (outcome, took)
            assert took > 1.5          # well over idle_timeout_s: the case at hand
            await asyncio.wait_for(rx.complete.wait(), 5)
            assert rx.md5() == offer["checksum"] == hashlib.md5(body).hexdigest()
            # a transfer that no longer moves keeps nothing alive: the silent connection idles out
            await v2.expect_eof(5)
            await poll(lambda: conn.closing, timeout=5, what="the idle connection is closed")
            await v2.close()
    finally:
        rx.close()


# -- 2. a short read fails the transfer --------------------------------------------------------------
class _Rows:
    """``PgDocuments.block`` of one document deleted while block 1 is being fetched (the reviewer's
    case: ``kb delete`` during a download)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.deleted = asyncio.Event()

    async def block(self, doc_id: str, seq: int) -> bytes | None:
        if seq > 0:
            await self.deleted.wait()
            return None
        return self.data[:BLOCK_BYTES]


class _Recording(LossyReceiver):
    def __init__(self, size: int, **kw: Any) -> None:
        super().__init__(size, **kw)
        self.lengths: list[int] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.lengths.append(len(data))
        super().datagram_received(data, addr)


class _Unreachable(_Rows):
    """PostgreSQL goes away while block 1 is being fetched."""

    async def block(self, doc_id: str, seq: int) -> bytes | None:
        if seq > 0:
            await self.deleted.wait()
            raise StorageUnavailable("PostgreSQL is unreachable")
        return self.data[:BLOCK_BYTES]


SIZE = 3 * BLOCK_BYTES
DATA = bytes(range(256)) * (SIZE // 256)


@pytest.mark.parametrize("rows_kind, logged", [
    (_Rows, "the document no longer has its 3145728 bytes (deleted meanwhile?): packet 1024: read 0 of 1024 bytes"),
    # (before: the StorageError escaped the transfer task: outcome "closed", "Task exception was never retrieved")
    (_Unreachable, "reading the document failed: PostgreSQL is unreachable"),
])
async def test_a_pg_download_whose_rows_go_fails_without_short_packets_and_frees_its_slot(
        rows_kind: type, logged: str, caplog: pytest.LogCaptureFixture) -> None:
    rows = rows_kind(DATA)
    reader = PgBlockReader(rows, asyncio.get_running_loop(), "d" * 24, SIZE, 0)  # type: ignore[arg-type]
    udp = UdpTransfer(TransferConfig())
    await udp.start("127.0.0.1")
    rx, port = await _Recording.open(SIZE, drop_every=0, corrupt_every=0)
    try:
        with caplog.at_level(logging.INFO, logger="nplt.udp"):
            transfer = udp.send(("127.0.0.1", port), reader, SIZE, "tok")   # type: ignore[arg-type]
            first_block = BLOCK_BYTES // DATA_BYTES
            await poll(lambda: rx.expected == first_block, what="the first block arrived")
            rows.deleted.set()                              # the rest of the document is gone
            assert await asyncio.wait_for(transfer.done, 10) == "failed"
        assert udp.transfers == {} and reader.closed and transfer.packets == {}
        await poll(lambda: len(rx.lengths) >= transfer.sent)
        # only whole packets were sent: never an empty one (it would read as an ACK) nor a short one
        assert set(rx.lengths) == {HEADER.size + DATA_BYTES}
        assert rx.expected == first_block and not rx.complete.is_set()
        assert b"".join(rx.parts) == DATA[:BLOCK_BYTES]
        messages = [r.getMessage() for r in caplog.records]
        assert any("tok" in m and "failed" in m and logged in m for m in messages), messages
        assert not any("complete" in m for m in messages)
    finally:
        rx.close()
        await udp.close()


# -- 3. names in NFC ---------------------------------------------------------------------------------
NFC = unicodedata.normalize("NFC", "résumé-Ångström.txt")
NFD = unicodedata.normalize("NFD", NFC)


async def test_a_name_uploaded_in_nfd_is_downloaded_by_its_nfc_spelling(tmp_path: Path) -> None:
    body = b"curriculum vitae\n\nten years of operations work.\n"
    rx, udp_port = await LossyReceiver.open(len(body), drop_every=0, corrupt_every=0)
    try:
        async with files_server(tmp_path) as (srv, addr):
            v2 = await connect(addr, udp_port=udp_port)
            send_file(v2, NFD, body)                       # (a name is stored as given)
            assert re.fullmatch(rf"文件上传成功: {NFD} \(ID: [0-9a-f]{{24}}\)", await v2.recv_text())
            for typed in (NFC, NFD, NFC.upper()):          # typed, as macOS gives it, in capitals
                v2.send(0x01, f"download {typed}")
                text, offers = await answer_with_offers(v2)
                assert [o["filename"] for o in offers] == [NFD], text
                await poll(lambda: not srv.services.udp.transfers)
            assert rx.complete.is_set() and rx.md5() == hashlib.md5(body).hexdigest()
            await v2.close()
    finally:
        rx.close()


def _doc(doc_id: str, name: str, md5: str) -> DocumentInfo:
    return DocumentInfo(doc_id, name, md5, md5 * 2, 10, 1, "user:local", "2026-11-25T12:00:00+00:00", LOCAL_USER)


class _ListKB:
    def __init__(self, *docs: DocumentInfo) -> None:
        self.docs = list(docs)

    async def list(self, user: str, groups: object) -> list[DocumentInfo]:
        return self.docs


async def test_find_compares_names_in_nfc() -> None:
    """A name stored decomposed is found by either spelling, also by a part of it, and two different
    documents whose names differ only in their spelling are one name: the user picks by id."""
    older = _doc("a" * 24, NFD, "1" * 32)                  # stored decomposed (a macOS upload)
    found = await OfferService(_ListKB(older), None, None).find(LOCAL_USER, (), name=NFC)  # type: ignore[arg-type]
    assert found is older
    found = await OfferService(_ListKB(older), None, None).find(LOCAL_USER, (), name="ångström")  # type: ignore[arg-type]
    assert found is older                                  # a part of the name, typed composed
    newer = _doc("b" * 24, NFC, "2" * 32)
    with pytest.raises(HandlerError) as exc:
        await OfferService(_ListKB(newer, older), None, None).find(LOCAL_USER, (), name=NFC)  # type: ignore[arg-type]
    assert exc.value.code == ErrorCode.NOT_FOUND and "2 different documents are named" in exc.value.message
    assert older.doc_id in exc.value.message and newer.doc_id in exc.value.message


# -- 4. a duplicate upload names the stored document ------------------------------------------------
async def test_a_duplicate_upload_says_under_which_name_it_is_stored(tmp_path: Path) -> None:
    body = b"# Same bytes\n\nuploaded twice under two names.\n"
    rx, udp_port = await LossyReceiver.open(len(body), drop_every=0, corrupt_every=0)
    try:
        async with files_server(tmp_path) as (srv, addr):
            v2 = await connect(addr, udp_port=udp_port)
            send_file(v2, "first.md", body)
            m = re.fullmatch(r"文件上传成功: first\.md \(ID: ([0-9a-f]{24})\)", await v2.recv_text())
            assert m
            send_file(v2, "second.md", body)
            reply = await v2.recv_text()
            assert reply == (f"文件上传成功: second.md (ID: {m[1]}); the same content is already stored as "
                             '"first.md": download it by that name or its ID')
            send_file(v2, "first.md", body)                # the same name again: nothing to explain
            assert await v2.recv_text() == f"文件上传成功: first.md (ID: {m[1]})"
            send_file(v2, "caf\u00e9.md", b"# Cafe\n\nopening hours.\n")
            cafe = re.fullmatch(r"文件上传成功: café\.md \(ID: ([0-9a-f]{24})\)", await v2.recv_text())
            assert cafe
            send_file(v2, "cafe\u0301.md", b"# Cafe\n\nopening hours.\n")   # the same name, spelled NFD
            assert await v2.recv_text() == f"文件上传成功: café.md (ID: {cafe[1]})"
            stored = await srv.services.knowledge.list(LOCAL_USER, ())
            assert sorted(d.name for d in stored) == ["café.md", "first.md"]
            v2.send(0x01, "download first.md")             # as told
            text, offers = await answer_with_offers(v2)
            assert [o["filename"] for o in offers] == ["first.md"], text
            await asyncio.wait_for(rx.complete.wait(), 10)
            assert rx.md5() == hashlib.md5(body).hexdigest()
            await v2.close()
    finally:
        rx.close()

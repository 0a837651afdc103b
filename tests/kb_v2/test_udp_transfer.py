"""The UDP Go-Back-N sender on loopback against a real receiver that drops and corrupts datagrams."""
from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from protocol import ErrorCode
from server.errors import HandlerError
from server.transfer_config import TransferConfig
from server.udp_transfer import (DATA_BYTES, HEADER, MAX_BYTES, UdpTransfer, ack_checksum, data_checksum,
                                 packet_count)
from rdt_receiver import LossyReceiver, ack_packet
from testkit.server import poll


def _file(tmp_path: Path, size: int) -> tuple[Path, str]:
    data = os.urandom(size)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return path, hashlib.md5(data).hexdigest()


async def _endpoint(**cfg: object) -> UdpTransfer:
    udp = UdpTransfer(TransferConfig(**cfg))   # type: ignore[arg-type]
    await udp.start("127.0.0.1")
    return udp


def test_checksums_follow_the_spec() -> None:
    import struct
    import zlib
    assert data_checksum(7, b"abc") == zlib.crc32(struct.pack(">H", 7) + b"abc") & 0xFFFF
    assert ack_checksum(65535) == zlib.crc32(b"\xff\xff") & 0xFFFF
    assert ack_packet(3) == HEADER.pack(3, ack_checksum(3))
    assert [packet_count(n) for n in (1, 1024, 1025, MAX_BYTES)] == [1, 1, 2, 65536]


@pytest.mark.parametrize(("size", "rto"), [(50 * DATA_BYTES + 17, 0.1), (300 * DATA_BYTES + 5, 0.01)])
async def test_lossy_and_corrupting_receiver_gets_the_exact_file(tmp_path: Path, size: int, rto: float) -> None:
    path, md5 = _file(tmp_path, size)
    udp = await _endpoint(udp_retransmit_s=rto)
    rx, port = await LossyReceiver.open(size, drop_every=7, corrupt_every=11, drop_ack_every=13)
    try:
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), size, "tok")
        assert await asyncio.wait_for(transfer.done, 60) == "complete"
        await asyncio.wait_for(rx.complete.wait(), 10)
        assert rx.md5() == md5 and len(rx.data) == size
        assert rx.dropped >= packet_count(size) // 7 - 1 and rx.corrupted >= 1
        assert rx.bad_checksums == rx.corrupted           # every damaged datagram was caught
        assert transfer.retransmitted > 0 and transfer.sent > packet_count(size)
        assert udp.transfers == {} and transfer.file.closed and transfer.packets == {}
    finally:
        rx.close()
        await udp.close()


async def test_a_client_that_never_acks_is_given_up_and_everything_released(tmp_path: Path) -> None:
    path, _ = _file(tmp_path, 20 * DATA_BYTES)
    udp = await _endpoint(udp_give_up_s=0.3, udp_retransmit_s=0.05)
    rx, port = await LossyReceiver.open(20 * DATA_BYTES, ack=False)
    try:
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), 20 * DATA_BYTES, "tok")
        assert await asyncio.wait_for(transfer.done, 10) == "gave up"
        assert udp.transfers == {} and transfer.file.closed and transfer.task.done()
        assert transfer.retransmitted >= 5 and transfer.base == 0
        await poll(lambda: rx.datagrams >= transfer.sent)
        assert rx.datagrams == transfer.sent    # nothing more is sent after giving up
        # the slot is free again: a new transfer to the same address may start
        udp.check(("127.0.0.1", port), 10)
    finally:
        rx.close()
        await udp.close()


async def test_limits_refuse_with_clear_errors(tmp_path: Path) -> None:
    path, _ = _file(tmp_path, 4 * DATA_BYTES)
    udp = await _endpoint(max_udp_transfers=1, udp_give_up_s=5)
    rx, port = await LossyReceiver.open(4 * DATA_BYTES, ack=False)
    try:
        with pytest.raises(HandlerError) as big:
            udp.check(("127.0.0.1", port), MAX_BYTES + 1)
        assert big.value.code == ErrorCode.QUOTA_EXCEEDED and "64 MiB" in big.value.message
        udp.check(("127.0.0.1", port), MAX_BYTES)          # exactly 65536 packets is allowed
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), 4 * DATA_BYTES, "tok")
        with pytest.raises(HandlerError) as same:
            udp.send(("127.0.0.1", port), open(path, "rb"), 10, "tok2")
        assert same.value.code == ErrorCode.SERVER_BUSY and "still running" in same.value.message
        with pytest.raises(HandlerError) as full:
            udp.check(("127.0.0.1", port + 1), 10)
        assert full.value.code == ErrorCode.SERVER_BUSY and "1 downloads are running" in full.value.message
    finally:
        await udp.close()                     # closing cancels the running transfer and closes its file
        rx.close()
    assert await transfer.done == "closed" and transfer.file.closed and udp.transfers == {}


async def test_bad_acks_are_ignored(tmp_path: Path) -> None:
    udp = await _endpoint()
    try:
        udp.datagram_received(b"\x00", ("127.0.0.1", 1))
        udp.datagram_received(HEADER.pack(0, ack_checksum(0) ^ 1), ("127.0.0.1", 1))
        udp.datagram_received(ack_packet(0), ("127.0.0.1", 1))      # no transfer to that address
        assert udp.bad_datagrams == 2
    finally:
        await udp.close()

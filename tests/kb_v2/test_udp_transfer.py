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


async def test_a_port_that_never_acks_gets_a_few_probes_and_is_given_up(tmp_path: Path) -> None:
    """Nothing proves the announced port is the client's: without any ACK, one window and then only
    the oldest packet, at doubling intervals, until udp_first_ack_s (udp_give_up_s is far away)."""
    path, _ = _file(tmp_path, 20 * DATA_BYTES)
    udp = await _endpoint(udp_first_ack_s=0.4, udp_retransmit_s=0.02, udp_give_up_s=30)
    rx, port = await LossyReceiver.open(20 * DATA_BYTES, ack=False)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), 20 * DATA_BYTES, "tok")
        assert await asyncio.wait_for(transfer.done, 3) == "gave up"
        assert 0.4 <= loop.time() - started < 3
        assert udp.transfers == {} and transfer.file.closed and transfer.task.done()
        assert transfer.base == 0 and transfer.packets == {}
        await poll(lambda: rx.datagrams >= transfer.sent)
        assert rx.datagrams == transfer.sent    # nothing more is sent after giving up
        # probes at 0.02, 0.06, 0.14, 0.30 s: the first window (5) + at most log2(0.4 / 0.02) + 2 probes
        assert 5 < rx.datagrams <= 5 + 7
        assert rx.seqs[:5] == [0, 1, 2, 3, 4] and set(rx.seqs[5:]) == {0}     # probes: the oldest packet only
        udp.check(("127.0.0.1", port), 10)     # the slot is free again
    finally:
        rx.close()
        await udp.close()


async def test_a_client_that_stops_acking_is_given_up_after_udp_give_up_s(tmp_path: Path) -> None:
    """After a first ACK the Go-Back-N rules apply: the whole window every udp_retransmit_s, given up
    after udp_give_up_s without progress, and everything released."""
    path, _ = _file(tmp_path, 20 * DATA_BYTES)
    udp = await _endpoint(udp_give_up_s=0.3, udp_retransmit_s=0.05, udp_first_ack_s=5)
    rx, port = await LossyReceiver.open(20 * DATA_BYTES, drop_every=0, corrupt_every=0, ack_limit=1)
    try:
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), 20 * DATA_BYTES, "tok")
        assert await asyncio.wait_for(transfer.done, 10) == "gave up"
        assert udp.transfers == {} and transfer.file.closed and transfer.task.done()
        assert transfer.acked and transfer.base >= 1 and transfer.retransmitted >= 5
        await poll(lambda: rx.datagrams >= transfer.sent)
        assert rx.datagrams == transfer.sent    # nothing more is sent after giving up
        udp.check(("127.0.0.1", port), 10)
    finally:
        rx.close()
        await udp.close()


async def test_a_client_that_starts_receiving_late_still_gets_the_file(tmp_path: Path) -> None:
    """A slow but real client: it loses the whole first window (receiver not running yet) and answers
    only a later probe; the transfer then goes on as usual."""
    size = 30 * DATA_BYTES + 3
    path, md5 = _file(tmp_path, size)
    udp = await _endpoint(udp_first_ack_s=2, udp_retransmit_s=0.02)
    rx, port = await LossyReceiver.open(size, drop_every=7, corrupt_every=11, ignore_first=7)
    try:
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), size, "tok")
        assert await asyncio.wait_for(transfer.done, 30) == "complete"
        await asyncio.wait_for(rx.complete.wait(), 10)
        assert rx.md5() == md5 and rx.seqs[5:7] == [0, 0]      # two probes were ignored, a third answered
    finally:
        rx.close()
        await udp.close()


class _Owner:
    """A connection as the transfer sees it (``TransferOwner``)."""

    def __init__(self) -> None:
        self.closed = False
        self.callbacks: list = []

    def when_closed(self, callback):  # type: ignore[no-untyped-def]
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)

    def close(self) -> None:
        self.closed = True
        for cb in list(self.callbacks):
            cb()


async def test_a_transfer_ends_when_its_connection_closes(tmp_path: Path) -> None:
    path, _ = _file(tmp_path, 50 * DATA_BYTES)
    udp = await _endpoint(udp_first_ack_s=30, udp_retransmit_s=0.01)
    rx, port = await LossyReceiver.open(50 * DATA_BYTES, ack=False)
    owner = _Owner()
    try:
        transfer = udp.send(("127.0.0.1", port), open(path, "rb"), 50 * DATA_BYTES, "tok", owner=owner)
        await poll(lambda: rx.datagrams >= 6)          # the first window and a probe arrived
        owner.close()
        sent_at_close = transfer.sent
        assert await asyncio.wait_for(transfer.done, 1) == "disconnected"
        assert transfer.sent == sent_at_close and udp.transfers == {} and transfer.file.closed
        assert owner.callbacks == []                   # unregistered
        await poll(lambda: rx.datagrams >= transfer.sent)
        assert rx.datagrams == transfer.sent
        with pytest.raises(HandlerError) as gone:      # a connection already closed gets no transfer
            udp.send(("127.0.0.1", port), open(path, "rb"), 10, "tok2", owner=owner)
        assert "closed" in gone.value.message and udp.transfers == {}
    finally:
        rx.close()
        await udp.close()


async def test_at_most_max_udp_transfers_per_client_address(tmp_path: Path) -> None:
    path, _ = _file(tmp_path, 4 * DATA_BYTES)
    udp = await _endpoint(max_udp_transfers_per_client=2, udp_first_ack_s=30)
    rxs = [await LossyReceiver.open(4 * DATA_BYTES, ack=False) for _ in range(3)]
    try:
        for _, port in rxs[:2]:
            udp.send(("127.0.0.1", port), open(path, "rb"), 4 * DATA_BYTES, "tok")
        with pytest.raises(HandlerError) as third:
            udp.check(("127.0.0.1", rxs[2][1]), 10)
        assert third.value.code == ErrorCode.SERVER_BUSY and "2 downloads to this client's address" in third.value.message
        udp.check(("127.0.0.2", rxs[2][1]), 10)        # another client address is not affected
    finally:
        await udp.close()
        for rx, _ in rxs:
            rx.close()


async def test_limits_refuse_with_clear_errors(tmp_path: Path) -> None:
    path, _ = _file(tmp_path, 4 * DATA_BYTES)
    udp = await _endpoint(max_udp_transfers=1, udp_give_up_s=5, udp_first_ack_s=5)
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

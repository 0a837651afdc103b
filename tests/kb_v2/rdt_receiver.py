"""A v2 client's UDP receiver ("RDT"), written from the spec, that loses and damages datagrams on purpose.

Deterministic faults: among first transmissions (the first datagram seen for each seq), every
``drop_every``-th is dropped and every ``corrupt_every``-th has a data byte flipped (the checksum must
catch it); every ``drop_ack_every``-th ACK is not sent. Packets whose checksum fails are dropped; a
receive window of 5 keeps packets that arrive ahead of the next expected one; every accepted packet is
answered with the cumulative ACK of the last in-order packet.

``ack=False``: a port nobody serves (every datagram is counted, nothing is ACKed). ``ignore_first=N``:
a client whose receiver starts late and lost the first N datagrams. ``ack_limit=N``: a client that
sends N ACKs and then goes silent. ``seqs`` records the seq of every datagram that arrived.
"""
from __future__ import annotations

import asyncio
import hashlib
import struct
import zlib

HEADER = struct.Struct(">HH")
WINDOW = 5


def ack_packet(seq: int) -> bytes:
    return HEADER.pack(seq, zlib.crc32(struct.pack(">H", seq)) & 0xFFFF)


class LossyReceiver(asyncio.DatagramProtocol):
    def __init__(self, size: int, *, drop_every: int = 7, corrupt_every: int = 11, drop_ack_every: int = 0,
                 ack: bool = True, ignore_first: int = 0, ack_limit: int | None = None) -> None:
        self.total = -(-size // 1024)
        self.drop_every, self.corrupt_every, self.drop_ack_every = drop_every, corrupt_every, drop_ack_every
        self.ack = ack
        self.ignore_first, self.ack_limit = ignore_first, ack_limit
        self.seqs: list[int] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.seen: set[int] = set()
        self.expected = 0
        self.window: dict[int, bytes] = {}
        self.parts: list[bytes] = []
        self.datagrams = 0
        self.dropped = self.corrupted = self.bad_checksums = self.acks = self.acks_dropped = 0
        self.complete = asyncio.Event()

    @classmethod
    async def open(cls, size: int, **kw: object) -> tuple[LossyReceiver, int]:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_datagram_endpoint(lambda: cls(size, **kw), local_addr=("127.0.0.1", 0))
        return proto, transport.get_extra_info("sockname")[1]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)

    def md5(self) -> str:
        return hashlib.md5(self.data).hexdigest()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.datagrams += 1
        if len(data) < HEADER.size:
            return
        seq, checksum = HEADER.unpack_from(data)
        self.seqs.append(seq)
        if not self.ack or self.datagrams <= self.ignore_first:
            return
        payload = data[HEADER.size:]
        if seq not in self.seen:
            self.seen.add(seq)
            n = len(self.seen)
            if self.drop_every and n % self.drop_every == 0:
                self.dropped += 1
                return
            if self.corrupt_every and n % self.corrupt_every == 0 and payload:
                self.corrupted += 1
                payload = bytes([payload[0] ^ 0x5A]) + payload[1:]
        if zlib.crc32(struct.pack(">H", seq) + payload) & 0xFFFF != checksum:
            self.bad_checksums += 1
            return
        if self.expected <= seq < self.expected + WINDOW:
            self.window[seq] = payload
            while self.expected in self.window:
                self.parts.append(self.window.pop(self.expected))
                self.expected += 1
        if self.expected and (self.ack_limit is None or self.acks < self.ack_limit):
            self.acks += 1
            if self.drop_ack_every and self.acks % self.drop_ack_every == 0:
                self.acks_dropped += 1
            elif self.transport is not None:
                self.transport.sendto(ack_packet(self.expected - 1), addr)
        if self.expected == self.total:
            self.complete.set()

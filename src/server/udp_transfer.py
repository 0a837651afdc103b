"""UDP downloads for v2 clients ("RDT", docs/knowledge.md "v2 clients"): one datagram endpoint, Go-Back-N.

Data packets: ``>HH`` (seq, checksum) + at most 1024 bytes, checksum = ``crc32(pack('>H', seq) + data) &
0xFFFF``; seq counts packets from 0, so a file has ceil(size / 1024) packets and at most 65536 (64 MiB).
ACKs from the client: ``>HH`` (seq, ``crc32(pack('>H', seq)) & 0xFFFF``), cumulative. The sender keeps
``udp_window`` packets in flight, resends every unacknowledged packet when ``udp_retransmit_s`` passes
without progress, and gives up after ``udp_give_up_s`` without progress.

The client names the UDP port (``CLIENT_UDP_PORT``) and nothing proves it listens there, so until the
first valid ACK the sender only probes: after the first window, it resends the oldest packet alone,
``udp_retransmit_s`` later, then at doubling intervals (at most ``FIRST_ACK_MAX_INTERVAL_S``), and gives
up after ``udp_first_ack_s``. A non-ACKing port thus gets at most ``udp_window`` + a handful of
datagrams per request (12 with the defaults) instead of a window every 0.1 s for 30 s. A real client
bound its UDP socket before it asked (spec), so the first window waits in its socket buffer until it
reads, and it ACKs within milliseconds of starting to. After the first ACK the Go-Back-N rules above
apply. A transfer also ends (``disconnected``) as soon as the connection that asked for it closes
(``TransferOwner``: the deployed client keeps its TCP connection open during a download): no datagram
is sent once the owner is closed, and its close callback frees the slot at once. Conversely, ACK
progress counts as that connection's activity (``on_progress``: the connection's idle timeout does not
cut a download that is still moving, however long it takes); a transfer that stalls sends no such
news, so the connection's idle timeout and ``udp_give_up_s`` apply as before.

One ``DatagramProtocol`` serves the whole server; transfers are keyed by the client's address (one at a
time per address), at most ``max_udp_transfers`` run at once and at most ``max_udp_transfers_per_client``
to one client IP address. A transfer holds the open file and at most one block of packets (64 KiB) ahead
of the window; file reads run in a worker thread. The file is closed and the slot released however the
transfer ends (complete, given up, failed, disconnected, server closing). Every data packet but the
last carries 1024 bytes, and the last ``size`` says: a read that comes short (a document deleted under
a PostgreSQL reader, which then has no more blocks to give) ends the transfer as ``failed``, before
any short or empty packet (a 0-byte data packet would look exactly like an ACK) is sent.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from typing import BinaryIO, Callable, Protocol

from protocol import ErrorCode
from server.errors import HandlerError
from server.transfer_config import TransferConfig
from storage.errors import StorageError

log = logging.getLogger("nplt.udp")

HEADER = struct.Struct(">HH")
SEQ = struct.Struct(">H")
DATA_BYTES = 1024
MAX_PACKETS = 65536
MAX_BYTES = DATA_BYTES * MAX_PACKETS          # 64 MiB: the largest file one offer can carry
BLOCK_PACKETS = 64                            # packets read and built ahead of the window at a time
FIRST_ACK_MAX_INTERVAL_S = 1.0                # longest wait between two probes before the first ACK


class TransferOwner(Protocol):
    """The connection a transfer is for (``server.legacy_v2_files.V2Files``): the transfer ends when it closes."""

    @property
    def closed(self) -> bool: ...
    def when_closed(self, callback: Callable[[], None]) -> Callable[[], None]: ...   # returns: unregister


def data_checksum(seq: int, data: bytes) -> int:
    return zlib.crc32(SEQ.pack(seq) + data) & 0xFFFF


def ack_checksum(seq: int) -> int:
    return zlib.crc32(SEQ.pack(seq)) & 0xFFFF


def packet_count(size: int) -> int:
    return -(-size // DATA_BYTES)


class ShortRead(Exception):
    """The file gave fewer bytes than the offer's size (a document deleted under a PostgreSQL reader)."""


def _build_block(f: BinaryIO, first: int, count: int, size: int) -> list[bytes]:
    """Worker thread: the next ``count`` packets of ``f`` (positioned at packet ``first``), each as
    long as ``size`` says (only the last packet may be short), or ShortRead."""
    out = []
    for seq in range(first, first + count):
        data = f.read(DATA_BYTES)
        want = min(DATA_BYTES, size - seq * DATA_BYTES)
        if len(data) != want:
            raise ShortRead(f"packet {seq}: read {len(data)} of {want} bytes")
        out.append(HEADER.pack(seq, data_checksum(seq, data)) + data)
    return out


class Transfer:
    """One file being sent to one client address."""

    def __init__(self, addr: tuple[str, int], f: BinaryIO, size: int, token: str,
                 owner: TransferOwner | None = None, on_progress: Callable[[], None] | None = None) -> None:
        self.addr = addr
        self.owner = owner
        self.on_progress = on_progress    # called on each ACK that moves the window (the owner's activity)
        self.file = f
        self.size = size
        self.token = token
        self.count = packet_count(size)
        self.base = 0                 # oldest unacknowledged packet
        self.next = 0                 # next packet never sent
        self.loaded = 0               # packets built so far (``packets`` holds base..loaded-1)
        self.packets: dict[int, bytes] = {}
        self.progress = asyncio.Event()
        self.sent = 0                 # datagrams sent, retransmissions included
        self.retransmitted = 0
        self.acked = False            # a valid ACK has arrived (the client listens on that port)
        self.outcome: str | None = None   # "complete", "gave up", "failed", "disconnected", "closed"
        self.stop_reason: str | None = None   # why the task was cancelled ("disconnected"); None: server closing
        self.unhook: Callable[[], None] | None = None   # unregisters the owner's close callback
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task | None = None

    def on_ack(self, seq: int) -> None:
        if self.base <= seq < self.next:       # cumulative: everything up to seq arrived
            for s in range(self.base, seq + 1):
                self.packets.pop(s, None)
            self.base = seq + 1
            self.acked = True
            self.progress.set()
            if self.on_progress is not None:
                self.on_progress()

    @property
    def gone(self) -> bool:
        """The connection that asked for this transfer has closed."""
        return self.owner is not None and self.owner.closed


class UdpTransfer(asyncio.DatagramProtocol):
    """The server's UDP endpoint and its transfers."""

    def __init__(self, config: TransferConfig) -> None:
        self.config = config
        self.transport: asyncio.DatagramTransport | None = None
        self.transfers: dict[tuple[str, int], Transfer] = {}
        self.host = ""
        self.port = 0
        self.bad_datagrams = 0        # ACKs with a wrong size or checksum (dropped)

    # -- endpoint ------------------------------------------------------------------------------------
    async def start(self, host: str) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, self.config.udp_port))
        self.transport = transport
        self.host, self.port = transport.get_extra_info("sockname")[:2]
        log.info("UDP downloads on %s:%d", self.host, self.port)
        return self.host, self.port

    async def close(self) -> None:
        for t in list(self.transfers.values()):
            if t.task is not None:
                t.task.cancel()
        tasks = [t.task for t in list(self.transfers.values()) if t.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) != HEADER.size:
            self.bad_datagrams += 1
            return
        seq, checksum = HEADER.unpack(data)
        if checksum != ack_checksum(seq):
            self.bad_datagrams += 1
            return
        transfer = self.transfers.get(addr[:2])
        if transfer is not None:
            transfer.on_ack(seq)

    def error_received(self, exc: Exception) -> None:   # e.g. ICMP port unreachable: the give-up timer decides
        log.debug("UDP error: %s", exc)

    # -- transfers -----------------------------------------------------------------------------------
    def check(self, addr: tuple[str, int], size: int) -> None:
        """HandlerError unless a transfer of ``size`` bytes to ``addr`` may start now."""
        if self.transport is None:
            raise HandlerError(ErrorCode.SERVER_BUSY, "UDP downloads are not available on this server")
        if size > MAX_BYTES:
            raise HandlerError(ErrorCode.QUOTA_EXCEEDED,
                               f"the file has {size} bytes; a v2 download carries at most {MAX_BYTES} bytes "
                               f"(64 MiB: {MAX_PACKETS} packets of {DATA_BYTES} bytes)")
        if addr in self.transfers:
            raise HandlerError(ErrorCode.SERVER_BUSY, "a download to this client is still running; try again "
                                                      "when it has finished")
        per_client = self.config.max_udp_transfers_per_client
        if sum(1 for a in self.transfers if a[0] == addr[0]) >= per_client:
            raise HandlerError(ErrorCode.SERVER_BUSY, f"{per_client} downloads to this client's address are "
                                                      "running; try again when one has finished")
        if len(self.transfers) >= self.config.max_udp_transfers:
            raise HandlerError(ErrorCode.SERVER_BUSY, f"{self.config.max_udp_transfers} downloads are running; "
                                                      "try again later")

    def send(self, addr: tuple[str, int], f: BinaryIO, size: int, token: str,
             owner: TransferOwner | None = None, on_progress: Callable[[], None] | None = None) -> Transfer:
        """Start sending ``size`` bytes of ``f`` (positioned at 0; closed by the transfer) to ``addr``;
        with ``owner``, only while that connection is open; ``on_progress`` is called on every ACK
        that moves the window."""
        try:
            self.check(addr, size)
            if owner is not None and owner.closed:
                raise HandlerError(ErrorCode.NOT_FOUND, "the connection closed")
        except HandlerError:
            f.close()
            raise
        transfer = Transfer(addr, f, size, token, owner, on_progress)
        self.transfers[addr] = transfer
        transfer.task = asyncio.get_running_loop().create_task(self._run(transfer))
        transfer.task.add_done_callback(lambda task: self._finished(transfer, task))
        if owner is not None:
            transfer.unhook = owner.when_closed(lambda: self._owner_closed(transfer))
        return transfer

    def _owner_closed(self, t: Transfer) -> None:
        """The connection that asked for ``t`` closed: stop now, free the slot."""
        if t.task is not None and not t.task.done():
            t.stop_reason = "disconnected"
            t.task.cancel()
            log.info("UDP download %s to %s:%d stopped: the connection closed (%d of %d packets "
                     "acknowledged)", t.token, *t.addr, t.base, t.count)

    def _tx(self, transfer: Transfer, seq: int) -> None:
        if self.transport is not None and not transfer.gone:
            self.transport.sendto(transfer.packets[seq], transfer.addr)
            transfer.sent += 1

    async def _run(self, t: Transfer) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        started = last_progress = loop.time()
        first_ack_deadline = started + cfg.udp_first_ack_s
        probe_interval = cfg.udp_retransmit_s        # before the first ACK: doubles after each probe
        outcome = "closed"
        try:
            while t.base < t.count:
                if t.gone:                        # (its close callback normally got here first)
                    outcome = "disconnected"
                    return
                while t.next < min(t.base + cfg.udp_window, t.count):
                    if t.next >= t.loaded:
                        n = min(BLOCK_PACKETS, t.count - t.loaded)
                        try:
                            block = await asyncio.to_thread(_build_block, t.file, t.loaded, n, t.size)
                        except ShortRead as exc:    # never a short or empty packet, never "complete"
                            outcome = "failed"
                            log.warning("UDP download %s to %s:%d failed: the document no longer has its "
                                        "%d bytes (deleted meanwhile?): %s; %d of %d packets acknowledged",
                                        t.token, *t.addr, t.size, exc, t.base, t.count)
                            return
                        except (OSError, StorageError) as exc:    # the file or PostgreSQL failed under it
                            outcome = "failed"
                            log.warning("UDP download %s to %s:%d failed: reading the document failed: %s; "
                                        "%d of %d packets acknowledged", t.token, *t.addr, exc, t.base, t.count)
                            return
                        for i, pkt in enumerate(block):
                            t.packets[t.loaded + i] = pkt
                        t.loaded += n
                    self._tx(t, t.next)
                    t.next += 1
                t.progress.clear()
                if t.acked:
                    wait = cfg.udp_retransmit_s
                else:
                    wait = max(min(probe_interval, first_ack_deadline - loop.time()), 0.0)
                try:
                    async with asyncio.timeout(wait):
                        await t.progress.wait()
                    last_progress = loop.time()
                except TimeoutError:
                    if t.gone:
                        outcome = "disconnected"
                        return
                    if not t.acked:              # nothing proves anyone listens there: probe, back off
                        if loop.time() >= first_ack_deadline:
                            outcome = "gave up"
                            log.info("UDP download %s to %s:%d abandoned: no ACK at all within %.1f s (%d "
                                     "datagrams sent)", t.token, *t.addr, cfg.udp_first_ack_s, t.sent)
                            return
                        self._tx(t, t.base)
                        t.retransmitted += 1
                        probe_interval = min(probe_interval * 2, max(FIRST_ACK_MAX_INTERVAL_S,
                                                                     cfg.udp_retransmit_s))
                        continue
                    if loop.time() - last_progress >= cfg.udp_give_up_s:
                        outcome = "gave up"
                        log.info("UDP download %s to %s:%d abandoned: no ACK for %.1f s (%d of %d packets "
                                 "acknowledged)", t.token, *t.addr, cfg.udp_give_up_s, t.base, t.count)
                        return
                    for seq in range(t.base, t.next):    # Go-Back-N: resend everything in flight
                        self._tx(t, seq)
                        t.retransmitted += 1
            outcome = "complete"
            log.info("UDP download %s to %s:%d complete: %d packets, %d retransmitted", t.token, *t.addr,
                     t.count, t.retransmitted)
        except OSError as exc:
            outcome = "gave up"
            log.warning("UDP download %s to %s:%d failed: %s", t.token, *t.addr, exc)
        except asyncio.CancelledError:
            outcome = t.stop_reason or "closed"
            raise
        finally:
            t.outcome = outcome

    def _finished(self, t: Transfer, task: asyncio.Task) -> None:
        """Done callback (also when the task was cancelled before it ever ran): release everything."""
        if t.outcome is None:
            t.outcome = t.stop_reason or "closed"
        if t.unhook is not None:
            t.unhook()
            t.unhook = None
        t.packets.clear()
        if self.transfers.get(t.addr) is t:
            del self.transfers[t.addr]
        t.file.close()          # a read-only file: closing it does no I/O worth a thread
        if not t.done.done():
            t.done.set_result(t.outcome)

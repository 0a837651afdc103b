"""Limits that span connections: buffered input server-wide, clients per IP, the admin slot.

- ``InputBudget``: the bytes of partial input (incomplete frames, fragmented messages being
  reassembled) held by all connections together, counted against ``max_total_input_buffer`` (as
  redis counts client buffers against ``maxmemory``). Each connection adds what its codec holds
  after every read and gives it all back when it closes. A connection whose fragmented message
  grows while the total is over the cap has that message refused (ERROR SERVER_BUSY, not fatal):
  its fragments are released at once and the rest of the message is skipped. (Messages are refused
  past 15/16 of the cap, so that reads in flight and allocator overhead mostly stay within it:
  with 40 or more connections sending at once RSS passes it by a few MiB, ~0.25 MiB a connection.)
- ``max_clients_per_ip``: connections from one address beyond it are refused with
  TOO_MANY_CONNECTIONS (v3 clients; a v2 client, or a silent one, which the server would serve as
  v2, reads one CHAT_TEXT saying why before the close, as for ``max_clients``: ``refusal_frame``).
  With an admin user, a connection from an address at its limit is kept on standby until its first
  read (at most ``legacy_grace_ms``, as a refused connection is), for an admin's HELLO only: a first
  read that is not a whole HELLO is refused at once; a HELLO is checked (``IP_STANDBY`` at a time per
  address), and an admin's gets in while fewer than ``max_clients_per_ip + IP_ADMIN_EXTRA``
  connections come from its address, else closes that address's oldest connection still in its
  handshake. So sockets that never finish their HELLO, on the admin's own address (an SSH tunnel's
  127.0.0.1), cannot keep the admin out, however many and however often they reconnect.
- The admin slot: when a configured user is marked ``admin``, one connection beyond
  ``max_clients`` is accepted, and it may only stay by saying HELLO as an admin. A connection that
  arrives when that slot is taken too is kept on standby (``AdminSlot``: not counted against
  ``max_clients``, counted against ``max_clients_per_ip``, for at most ``standby_timeout_s``): an
  admin's HELLO on it closes the oldest connection still in its handshake (TLS handshake, or no
  HELLO accepted yet) and takes its place, when a non-admin holds the admin slot
  (``server.app.Server.make_room``). An anonymous client can hold the slot, but never keep an admin
  out: its socket is the one closed, however often it reconnects.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import socket
from typing import Any, Callable, Iterable

import orjson

from protocol import ErrorCode, MsgType, encode_frame, looks_like_tls
from protocol.messages import request_id


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere, e.g. musl or macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_malloc_trim = _find_malloc_trim()
TRIM_MIN_BYTES = 1 << 20     # given back at once: worth asking the allocator to return free pages
TRIM_DELAY_S = 0.2           # (and at most one trim per this interval, in a worker thread)
FULL = "max_clients reached"     # refusal reasons (``Server.refuse_reason``)
STOPPING = "shutting down"
PEEK_BYTES = 5               # bytes of a TLS port's first read looked at (a frame header, a TLS record's)
DRAIN_BYTES = 1 << 16        # at most this much of a non-TLS client's input is read before its reply
HEADROOM = 16                # messages are refused past (15/16) of the cap: headroom for reads in flight
                             # and the allocator (bench/abandoned_fragments.py measures what passes it)
#: With an admin user: HELLOs checked at once per address beyond ``max_clients_per_ip`` (on standby,
#: for an admin's; a failed login held in back-off keeps its place: guesses stay bounded per address).
IP_STANDBY = 4
#: With an admin user: how many connections from one address an admin's HELLO may make the address
#: reach without closing one of its connections still in their handshake (``max_clients_per_ip`` +).
IP_ADMIN_EXTRA = 1
#: A connection that closes with at least this much output unsent (its largest backlog: the transport's
#: buffer plus what was held behind it) asks for a ``malloc_trim``, as released input does.
TRIM_OUTPUT_BYTES = TRIM_MIN_BYTES


class InputBudget:
    """Partial input held by every connection of the server, in bytes (``total``), the most it
    reached (``peak``), and how many messages were refused for it (``refused``).

    Bytes given back in bulk (a connection closing with a large message half received, or with a
    large output backlog unsent: ``trim_soon``) are followed by a ``malloc_trim`` in a worker thread:
    glibc keeps freed 64 KiB blocks in the heap, so without it RSS would stay at its peak after the
    memory is free. ``trim_requests`` counts the requests, ``trims`` the trims run (at most one per
    ``TRIM_DELAY_S``).
    """

    __slots__ = ("total", "peak", "refused", "trims", "trim_requests", "_trim")

    def __init__(self) -> None:
        self.total = 0
        self.peak = 0
        self.refused = 0
        self.trims = 0
        self.trim_requests = 0
        self._trim: asyncio.TimerHandle | asyncio.Future | None = None

    @staticmethod
    def threshold(cap: int) -> int:
        """The total over which growing messages are refused."""
        return cap - cap // HEADROOM

    def add(self, delta: int) -> int:
        total = self.total = self.total + delta
        if total > self.peak:
            self.peak = total
        return total

    def give_back(self, n: int) -> None:
        """``n`` bytes were released (the caller holds the event loop)."""
        self.add(-n)
        if n >= TRIM_MIN_BYTES:
            self.trim_soon()

    def trim_soon(self) -> None:
        """Memory was freed in bulk (the caller holds the event loop): a ``malloc_trim`` in a worker
        thread ``TRIM_DELAY_S`` from now, unless one is already due or running."""
        self.trim_requests += 1
        if self._trim is None and _malloc_trim is not None:
            self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._start_trim)

    def _start_trim(self) -> None:
        self.trims += 1
        fut = asyncio.get_running_loop().run_in_executor(None, _malloc_trim, 0)
        self._trim = fut
        fut.add_done_callback(self._trimmed)

    def _trimmed(self, fut: asyncio.Future) -> None:
        self._trim = None
        if not fut.cancelled():
            fut.exception()   # (retrieved: malloc_trim does not raise; a closed executor might)


class AdminSlot:
    """The server's admin slot (only with an admin user): the connections on standby (``waiting``:
    ServerConnections, and TLS connections in their handshake, each with an ``ip``) and
    ``make_room(conn)``, which says whether an admin's HELLO on the standby ``conn`` may take a slot
    (closing a connection still in its handshake for it)."""

    __slots__ = ("waiting", "make_room")

    def __init__(self, make_room: Callable[[Any], bool]) -> None:
        self.waiting: set[Any] = set()
        self.make_room = make_room


def peer_ip(peername: Any) -> str:
    """The address part of a transport's ``peername`` ("?" when there is none, e.g. a UNIX socket)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return "?"


def count_from(connections: Iterable[Any], ip: str) -> int:
    """How many of ``connections`` (objects with an ``ip``) come from ``ip``."""
    return sum(1 for c in connections if c.ip == ip)


def regular_clients(connections: Iterable[Any]) -> int:
    """Connections that do not hold the admin slot (every one but those of admins after HELLO)."""
    return sum(1 for c in connections if not c.admin)


def full_text(max_clients: int, admin_slot: bool = False) -> str:
    """What a v2 client refused over ``max_clients`` reads (one CHAT_TEXT, then the close)."""
    beyond = "; the one slot beyond is reserved for an admin" if admin_slot else ""
    return f"Server is full ({max_clients} clients{beyond}); try again later."


def per_ip_text(ip: str, per_ip: int) -> str:
    """What a v2 client refused over ``max_clients_per_ip`` reads."""
    return f"Too many connections from {ip} (max_clients_per_ip = {per_ip}); try again later."


REQUIRES_TLS = ("This server requires TLS: connect with an NPLT v3 client and TLS (this client cannot); "
                "the connection is closed.")


def v2_text_frame(text: str) -> bytes:
    """One v2 CHAT_TEXT frame (seq 0: the first frame the server sends) carrying ``text``."""
    return encode_frame(MsgType.CHAT_TEXT, 0, text.encode())


def refusal_frame(first: bytes, code: ErrorCode, message: str, v2_text: str = "") -> bytes:
    """What a client refused on its first read ``first`` (b"": it sent nothing within the grace
    period) is sent before the close.

    A v3 client starts with HELLO (type code 0x20): it gets ERROR ``code`` (fatal), with the HELLO's id
    when the whole frame is in ``first``. The first bytes of a TLS handshake (a TLS client on a
    plain-TCP port) get nothing. Anything else, silence included, is what the server serves as a v2
    client: it gets ``v2_text`` in one CHAT_TEXT, as a v2 client refused for authentication does
    (nothing when ``v2_text`` is empty).
    """
    if not first or first[0] != MsgType.HELLO:
        if looks_like_tls(first) or not v2_text:
            return b""
        return v2_text_frame(v2_text)
    re = None
    if len(first) >= 5:
        end = 5 + int.from_bytes(first[3:5], "big")
        if len(first) >= end:
            try:
                re = request_id(orjson.loads(first[5:end]))
            except orjson.JSONDecodeError:
                re = None   # a HELLO we cannot read still gets the error, without an id
    payload = orjson.dumps({"re": re, "code": code, "message": message, "fatal": True})
    return encode_frame(MsgType.ERROR, 0, payload)


async def plain_on_tls_reply(sock: socket.socket, timeout: float) -> bytes | None:
    """On a TLS port, before the TLS handshake: the reply for a client that is not speaking TLS.

    Waits (at most ``timeout`` s) until ``sock`` (accepted, non-blocking) is readable and peeks at
    its first bytes (``MSG_PEEK``: they stay for the TLS handshake). None when they start a TLS
    record (0x16 0x03 ..), when nothing came in time (a silent client may be a TLS client that is
    slow to send its ClientHello: plain bytes would break its handshake, so it is not answered),
    when the peer closed, and for a v3 client (first byte HELLO: its TLS handshake fails and it sees
    the close, as before): then the TLS handshake goes on. Otherwise, bytes that no TLS client
    sends, one v2 CHAT_TEXT saying the server requires TLS (``REQUIRES_TLS``): to be sent in plain
    TCP before the socket is closed, with no TLS handshake."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, lambda: None if ready.done() else ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        return None
    finally:
        loop.remove_reader(fd)
    try:
        first = sock.recv(PEEK_BYTES, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError, ConnectionError, OSError):
        return None
    if not first or first[0] == MsgType.HELLO or looks_like_tls(first) or (first[0] == 0x16 and len(first) < 3):
        return None
    return v2_text_frame(REQUIRES_TLS)


def reply_plain_and_close(sock: socket.socket, reply: bytes) -> None:
    """Send ``reply`` (``plain_on_tls_reply``'s, a few hundred bytes: it fits the empty send buffer of
    a new socket) in plain TCP and close ``sock``. What the client sent is read first (at most
    ``DRAIN_BYTES``): a socket closed with unread input is reset, and the reset can discard the reply
    before the client reads it; the write side is then shut (FIN) before the close."""
    try:
        drained = 0
        while drained < DRAIN_BYTES:
            got = sock.recv(65536)
            if not got:
                break
            drained += len(got)
    except (BlockingIOError, InterruptedError, OSError):
        pass
    try:
        sock.send(reply)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()

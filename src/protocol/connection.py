"""The sans-IO NPLT connection: feed it bytes, get events; give it messages, get bytes.

See docs/protocol.md §1-2 and §8 and docs/architecture.md. No I/O here: the caller owns the socket.
One Connection per side of one TCP connection. It holds a ``receiver.Receiver`` (the receiving half,
which holds the v2 parser) and does the sending itself; the receiving methods are the receiver's own
bound methods, so a read costs no extra call.
"""
from __future__ import annotations

from typing import Any

import orjson

from .codes import V3_ONLY_TYPES, ErrorCode, MsgType, ProtocolVersion, Role, type_name
from .errors import ProtocolError, closed_error
from .frame import HEADER, MAX_PAYLOAD
from .receiver import DEFAULT_MAX_MESSAGE_SIZE, Receiver

_FRAGMENT = int(MsgType.FRAGMENT)
_pack = HEADER.pack
_dumps = orjson.dumps
# Enum member lookups cost ~100 ns each on Python 3.11: bind them once.
_UNKNOWN, _V2, _V3 = ProtocolVersion.UNKNOWN, ProtocolVersion.V2, ProtocolVersion.V3


class Connection:
    """One side of one NPLT connection (sans-IO).

    Server role: ``version`` is UNKNOWN until the first complete frame (HELLO -> V3, anything
    else -> V2) or ``set_legacy()``. Client role: V3 unless another version is given.
    ``receive_data`` returns events; recoverable errors are ``InvalidMessage`` events, fatal ones
    raise ``ProtocolError`` (with ``.events`` = what was decoded before) and close the connection.
    After a clean EOF (``receive_data(b"")``) sending still works; receiving raises.
    ``receive_and_pong`` is ``receive_data`` answering well-formed v3 PINGs itself (``pong_one``: a
    read that is exactly one canonical PING, answered or None); ``receive_and_heartbeat`` and
    ``heartbeat_one`` are their v2 counterparts for ``CHAT_TEXT "HEARTBEAT"``;
    ``tx_seq`` is the seq of the next frame sent, ``rx_seq`` the seq expected next.
    ``receiver`` is the decoding state (``protocol.receiver.Receiver``).
    """

    __slots__ = ("role", "receiver", "receive_data", "receive_and_pong", "pong_one", "receive_and_heartbeat",
                 "heartbeat_one", "refuse_message", "close")

    def __init__(self, role: Role | str, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 max_buffer_size: int | None = None,
                 version: ProtocolVersion = ProtocolVersion.UNKNOWN) -> None:
        self.role = Role(role)
        if self.role is Role.CLIENT and version is ProtocolVersion.UNKNOWN:
            version = ProtocolVersion.V3
        rx = self.receiver = Receiver(version, max_message_size, max_buffer_size)
        # The receiving API is the receiver's: its bound methods, called without a forwarding frame.
        self.receive_data = rx.receive_data
        self.receive_and_pong = rx.receive_and_pong
        self.pong_one = rx.pong_one
        self.receive_and_heartbeat = rx.receive_and_heartbeat
        self.heartbeat_one = rx.heartbeat_one
        self.refuse_message = rx.refuse_message
        self.close = rx.close

    # ------------------------------------------------------------------ the receiver's state
    @property
    def version(self) -> ProtocolVersion:
        """UNKNOWN (server, before the first frame), V2 or V3."""
        return self.receiver.version

    @property
    def closed(self) -> bool:
        """True after a fatal error or ``close()`` (sending raises CONNECTION_CLOSED too)."""
        return self.receiver.closed

    @property
    def eof(self) -> bool:
        """True once the peer's end of stream was fed (``receive_data(b"")``)."""
        return self.receiver.eof

    @property
    def bytes_buffered(self) -> int:
        """Bytes held between calls: a partial frame plus a message being reassembled."""
        return self.receiver.bytes_buffered

    @property
    def in_message(self) -> bool:
        """A message has started and not ended (see ``Receiver.in_message``)."""
        return self.receiver.in_message

    @property
    def seq_anomalies(self) -> int:
        """v2 only: received frames whose seq was not the expected one."""
        return self.receiver.seq_anomalies

    @property
    def max_message_size(self) -> int:
        """Largest message accepted, and sent (v3, reassembled); a client lowers it to the
        server's limit after HELLO."""
        return self.receiver.max_message_size

    @max_message_size.setter
    def max_message_size(self, value: int) -> None:
        self.receiver.max_message_size = value

    @property
    def max_buffer_size(self) -> int:
        return self.receiver.max_buffer_size

    @property
    def tx_seq(self) -> int:
        """The seq the next frame sent on this connection will carry (read-only)."""
        return self.receiver.tx_seq

    @property
    def rx_seq(self) -> int:
        """The seq expected on the next received frame (read-only)."""
        return self.receiver.rx_seq

    def set_legacy(self) -> None:
        """Server: this is a v2 connection (no frame within the grace period, or a first byte
        that is not HELLO's).

        No effect once the version is decided.
        """
        rx = self.receiver
        if rx.version is _UNKNOWN:
            rx.version = _V2

    # ------------------------------------------------------------------ sending
    def send(self, type: MsgType | int, body: dict[str, Any] | bytes | str = b"") -> bytes:
        """Encode one logical message; returns every frame of it as one byte string.

        v3: a dict is JSON-encoded (bytes are taken as already-encoded JSON) and fragmented when
        over 65535 bytes. v2: str is UTF-8 encoded, a dict JSON-encoded; the payload must fit one
        frame and the type must be one a v2 peer knows. Errors that leave the connection usable
        (too large, v3-only type to a v2 peer) raise a non-fatal ProtocolError.
        """
        rx = self.receiver
        if rx.closed:
            raise closed_error("send on a closed connection")
        if type == _FRAGMENT or not 0 <= type <= 0xFF:
            raise ValueError(f"cannot send type code {type!r}")
        version = rx.version
        if isinstance(body, bytes):
            payload = body
        elif isinstance(body, (bytearray, memoryview)):
            payload = bytes(body)
        elif isinstance(body, dict) or (isinstance(body, str) and version is _V2):
            try:
                payload = _dumps(body) if isinstance(body, dict) else body.encode("utf-8")
            except (orjson.JSONEncodeError, UnicodeEncodeError) as exc:
                # a text that is not valid UTF-8 (surrogates from undecodable input), a value JSON
                # has no form for: this message is refused, the connection stays usable
                raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"the message cannot be encoded: {exc}",
                                    fatal=False) from None
        else:
            raise TypeError(f"cannot send a body of type {body.__class__.__name__} "
                            f"on a {version.name} connection")
        n = len(payload)
        if version is _V3:
            if n > rx.max_message_size:
                raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE,
                                    f"message of {n} bytes is over max_message_size "
                                    f"({rx.max_message_size})", fatal=False)
            if n > MAX_PAYLOAD:
                return self._fragment(type, payload)
        elif version is _V2:
            if type in V3_ONLY_TYPES:
                raise ProtocolError(ErrorCode.UNSUPPORTED,
                                    f"{type_name(type)} is a v3 type; a v2 peer cannot receive it",
                                    fatal=False)
            if n > MAX_PAYLOAD:
                raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE,
                                    f"v2 payload of {n} bytes does not fit one frame "
                                    f"({MAX_PAYLOAD}); split it with split_text_utf8", fatal=False)
        else:
            raise RuntimeError("protocol version not decided yet: wait for the first frame "
                               "or call set_legacy()")
        seq = rx.tx_seq
        rx.tx_seq = (seq + 1) & 0xFFFF
        return _pack(type, seq, n) + payload

    def send_raw(self, type: int, payload: bytes = b"") -> bytes:
        """Encode exactly one frame with this payload (no JSON, no fragmentation, no checks)."""
        rx = self.receiver
        if rx.closed:
            raise closed_error("send on a closed connection")
        if not 0 <= type <= 0xFF:
            raise ValueError(f"type code out of range: {type!r}")
        n = len(payload)
        if n > MAX_PAYLOAD:
            raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE,
                                f"payload of {n} bytes does not fit one frame ({MAX_PAYLOAD})",
                                fatal=False)
        seq = rx.tx_seq
        rx.tx_seq = (seq + 1) & 0xFFFF
        return _pack(type, seq, n) + payload

    def _fragment(self, type: int, payload: bytes) -> bytes:
        count = (len(payload) - 1) // MAX_PAYLOAD       # FRAGMENT frames before the final one
        view = memoryview(payload)
        out = bytearray()
        rx = self.receiver
        seq = rx.tx_seq
        for i in range(count):
            out += _pack(_FRAGMENT, seq, MAX_PAYLOAD)
            out += view[i * MAX_PAYLOAD:(i + 1) * MAX_PAYLOAD]
            seq = (seq + 1) & 0xFFFF
        rest = view[count * MAX_PAYLOAD:]
        out += _pack(type, seq, len(rest))
        out += rest
        rx.tx_seq = (seq + 1) & 0xFFFF
        return bytes(out)

"""The receiving half of the sans-IO NPLT connection: bytes in, events out.

Frames are parsed straight out of the received ``bytes`` with ``struct.unpack_from``. Only the
partial frame at the end of a read is kept (as a list of pieces, joined once when it completes),
and the common case (a complete, known, unfragmented frame) takes a short inline path that builds
the ``Message`` without calling its ``__init__`` (one Python frame less per message). On request the
v3 path also answers well-formed PINGs itself (``Connection.receive_and_pong``). The v2 frames are
parsed by the ``receiver_v2.V2Receiver`` the receiver holds.
See docs/protocol.md §1-2, §5.5 and §8.
"""
from __future__ import annotations

import orjson

from .binary import MAX_DATA
from .codes import BINARY_TYPES, V2_ONLY_TYPES, ErrorCode, MsgType, ProtocolVersion, type_name
from .errors import ProtocolError, closed_error
from .events import Event, InvalidMessage, Message
from .frame import HEADER, HEADER_SIZE, MAX_FRAME, TLS_ON_PLAIN_PORT, looks_like_tls
from .jsonbody import decode_body, json_error, not_object
from .pong import CANON_PING_MAX, ID_PREFIX, MAX_ID_CHARS, MIN_RUN, RE_PREFIX, answer_run, pong_parts
from .pong import cache as _pong_cache
from .receiver_v2 import _MEMBERS, _V2_TYPE, HEARTBEAT, V2Receiver

DEFAULT_MAX_MESSAGE_SIZE = 8 << 20      # 8 MiB reassembled
BUFFER_SLACK = 4096                     # added to the default max_buffer_size

_FRAGMENT = int(MsgType.FRAGMENT)
_HELLO = int(MsgType.HELLO)
_PING = MsgType.PING
_PONG = int(MsgType.PONG)
_CHAT_TEXT = int(MsgType.CHAT_TEXT)
_HEARTBEAT_TAIL = b"\x00\x09" + HEARTBEAT  # a v2 heartbeat frame after its type and seq
_CANON_PING_FRAME = CANON_PING_MAX + 5  # the longest canonical PING frame (header included)
_unpack_from = HEADER.unpack_from
_pack = HEADER.pack
_new = object.__new__                   # Message instances without a Python-level __init__ call
# Enum member lookups cost ~100 ns each on Python 3.11: bind them once.
_UNKNOWN, _V2, _V3 = ProtocolVersion.UNKNOWN, ProtocolVersion.V2, ProtocolVersion.V3
_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError

#: v3 fast path: known, non-FRAGMENT, JSON codes of v3 -> MsgType member; everything else None.
_V3_FAST: tuple[MsgType | None, ...] = tuple(
    None if i == _FRAGMENT or i in BINARY_TYPES or i in V2_ONLY_TYPES else _MEMBERS.get(i) for i in range(256))
#: v3 binary codes (a raw payload, not JSON: ``protocol.binary``) -> MsgType member.
_V3_BINARY = {int(m): m for m in BINARY_TYPES}
#: v2-only codes (the v2 file types, AGENT_THOUGHT): UNSUPPORTED on v3, the payload never read.
_V2_ONLY = {int(m): m for m in V2_ONLY_TYPES}


class Receiver:
    """Decoding state of one connection. A ``Connection`` holds one (and does the sending); the v2
    frame parsing is a ``V2Receiver`` this object holds (``v2``).

    The receiver owns both sequence counters: ``rx_seq`` (expected on the next received frame) and
    ``tx_seq`` (of the next frame sent), because its PING and heartbeat fast paths answer frames
    themselves; the connection's sending side takes its seqs from ``tx_seq``."""

    __slots__ = ("version", "max_message_size", "max_buffer_size", "v2", "rx_seq", "tx_seq", "closed",
                 "_pending", "_pending_len", "_parts", "_frag_size", "_discarding", "_discard_size",
                 "_refusal", "_eof", "_heartbeats", "_ping_ok")

    def __init__(self, version: ProtocolVersion, max_message_size: int,
                 max_buffer_size: int | None) -> None:
        if max_message_size < 1:
            raise ValueError(f"max_message_size must be >= 1, got {max_message_size}")
        if max_buffer_size is None:
            max_buffer_size = max_message_size + MAX_FRAME + BUFFER_SLACK
        elif max_buffer_size < 1:
            raise ValueError(f"max_buffer_size must be >= 1, got {max_buffer_size}")
        self.version = ProtocolVersion(version)
        self.max_message_size = max_message_size
        self.max_buffer_size = max_buffer_size
        self.v2 = V2Receiver()           # the v2 frame parser (and its seq_anomalies count)
        self._pending: list[bytes] = []  # pieces of an incomplete frame carried over to the next
        self._pending_len = 0            # call; once 5 bytes are held, piece 0 holds the header
        self.rx_seq = 0                  # seq expected on the next received frame
        self.tx_seq = 0                  # seq of the next sent frame (sent by Connection, and
                                         # by the PING and heartbeat fast paths here)
        self._parts: list[bytes] = []    # pieces of a fragmented message being reassembled
        self._frag_size = 0
        self._discarding = False         # dropping an over-size message up to its final frame
        self._discard_size = 0
        self._refusal: ProtocolError | None = None  # why the message being discarded was refused
        self.closed = False              # True after a fatal error or ``close()``
        self._eof = False
        self._heartbeats: list[bytes] | None = None  # receive_and_heartbeat's out, during the call
        # pong_one may answer: v3, open, no message in progress. Kept by every method that changes
        # those (set at the end of each receive, cleared by close, EOF and refuse_message)
        self._ping_ok = self.version is _V3

    @property
    def seq_anomalies(self) -> int:
        """v2 only: frames whose seq was not the expected one."""
        return self.v2.seq_anomalies

    @property
    def eof(self) -> bool:
        """True once the peer's end of stream was fed (``receive_data(b"")``)."""
        return self._eof

    @property
    def bytes_buffered(self) -> int:
        """Bytes held between calls: a partial frame plus a message being reassembled."""
        return self._pending_len + self._frag_size

    @property
    def in_message(self) -> bool:
        """A message has started and not ended: a partial frame, or a fragmented message being
        reassembled or skipped."""
        return bool(self._pending_len or self._frag_size or self._discarding)

    def refuse_message(self, code: ErrorCode | str, message: str) -> int:
        """Refuse the fragmented message being reassembled (v3): its fragments are released now,
        the rest of it is skipped as it arrives, and its final frame gives
        ``InvalidMessage(ProtocolError(code, message, fatal=False))`` (``re`` None: the body, where
        the id is, is never read). The connection stays usable. Returns the bytes released (0 when
        no message is being reassembled)."""
        size = self._frag_size
        if not size or self._discarding:
            return 0
        self._parts = []
        self._frag_size = 0
        self._discarding = True
        self._ping_ok = False
        self._discard_size = size
        self._refusal = ProtocolError(code, message, fatal=False)
        return size

    def close(self) -> None:
        """Close locally: further calls raise CONNECTION_CLOSED; buffers are released."""
        self.closed = True
        self._ping_ok = False
        self._pending = []
        self._pending_len = 0
        self._parts = []
        self._frag_size = 0
        self._discarding = False
        self._refusal = None

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed received bytes (any chunking); ``b""`` means the peer closed (EOF)."""
        return self.receive_and_pong(data, None, None)

    def receive_and_heartbeat(self, data: bytes, out: list[bytes]) -> list[Event]:
        """v2 ``receive_data`` that answers the heartbeats at the head of ``data`` itself.

        For a server whose v2 request worker is idle (nothing queued, nothing running): every
        ``CHAT_TEXT "HEARTBEAT"`` frame (that exact payload) that comes before the first other
        complete frame of this call is not reported; its reply, ``CHAT_TEXT "HEARTBEAT"`` (the
        bytes ``send(CHAT_TEXT, b"HEARTBEAT")`` would give), is appended to ``out``, which the
        caller must send before anything else. From the first other frame on, heartbeats are
        events like any frame, so replies keep the order of requests. A heartbeat split across
        reads is an event too. ValueError unless the version is V2.
        """
        if self.version is not _V2:
            raise ValueError("receive_and_heartbeat is for v2 connections")
        reply = self.heartbeat_one(data)
        if reply is not None:
            out.append(reply)
            return []
        self._heartbeats = out
        try:
            return self.receive_and_pong(data, None, None)
        finally:
            self._heartbeats = None

    def heartbeat_one(self, data: bytes) -> bytes | None:
        """The reply to ``data`` if it is exactly one v2 heartbeat frame (``CHAT_TEXT "HEARTBEAT"``)
        with nothing in progress, the receiver's state advanced as ``receive_and_heartbeat`` would
        (the same outcome as its frame loop, without its setup); else None with nothing changed. For a
        server whose v2 request worker is idle, as for ``receive_and_heartbeat``, which starts with it."""
        if len(data) == 14 and data[0] == _CHAT_TEXT and type(data) is bytes and data.endswith(_HEARTBEAT_TAIL) \
                and self.version is _V2 and not (self._pending_len or self.closed or self._eof) and self.max_message_size >= 9:
            seq = (data[1] << 8) | data[2]
            if seq != self.rx_seq:
                self.v2.seq_anomalies += 1
            self.rx_seq = (seq + 1) & 0xFFFF
            tx = self.tx_seq
            self.tx_seq = (tx + 1) & 0xFFFF
            return _pack(_CHAT_TEXT, tx, 9) + HEARTBEAT
        return None

    def pong_one(self, data: bytes, time: str) -> bytes | None:
        """The PONG frame answering ``data`` if it is exactly one canonical v3 PING (``b'{"id":N}'``
        as orjson writes it, in sequence, with no message in progress), the receiver's state
        advanced as ``receive_and_pong`` would; else None with nothing changed (then call
        ``receive_and_pong``, which starts with this). A server's hottest path: one read, one PING,
        one PONG. ``time``: as for ``receive_and_pong``."""
        n = len(data)
        if 13 <= n <= _CANON_PING_FRAME and data[0] == 0x23 and data[-1] == 0x7D and self._ping_ok \
                and type(data) is bytes:
            _, seq, ln = _unpack_from(data)     # (the same outcome as receive_and_pong's loop)
            digits = data[11:n - 1]
            if ln == n - 5 and seq == self.rx_seq and ln <= self.max_message_size \
                    and data[5:11] == ID_PREFIX and digits.isdigit() \
                    and (ln == 8 or digits[0] != 0x30):
                parts = _pong_cache[0]
                if parts[0] != time:
                    parts = pong_parts(time)
                tx = self.tx_seq
                self.rx_seq = (seq + 1) & 0xFFFF
                self.tx_seq = (tx + 1) & 0xFFFF
                pong = RE_PREFIX + digits + parts[2]
                return _pack(_PONG, tx, len(pong)) + pong
        return None

    def receive_and_pong(self, data: bytes, time: str | None,
                         out: list[bytes] | None) -> list[Event]:
        """``receive_data`` that answers well-formed v3 PINGs itself (a server's hot path).

        A v3 PING whose body is a JSON object with a valid ``"id"`` (docs/protocol.md §3) is not
        reported: its PONG ``{"re": id, "time": time}`` (the bytes ``send(PONG, {...})`` would give,
        framed like ``send_raw``) is appended to ``out`` as it is decoded (in order; a run of PINGs
        may share one bytes object), so ``out`` is complete even when a fatal ProtocolError is
        raised later in the same call. The caller must send it before anything it sends
        afterwards (the PONGs took the next outgoing seqs). Everything else is returned as by
        ``receive_data``, including malformed PINGs and the rare PING that is not answered here
        (split across reads, or fragmented): the caller still answers PING events. On a v2 connection, or with ``out=None``, this is
        ``receive_data``.
        ``time``: a str of at most ``protocol.pong.MAX_PONG_TIME_CHARS`` characters (else
        ValueError, raised before anything is consumed). The v3 frame loop is inline here, so a
        read costs one Python call.
        """
        if self.closed or self._eof:
            raise closed_error("data received after the connection was closed")
        if not data:
            return self._on_eof()
        if type(data) is not bytes:
            data = bytes(data)
        if out is None:
            ping = None                 # never a MsgType member: no frame is answered
            fmt_int = tail = b""
        else:                           # (checked before any state changes)
            ping = _PING
            parts = _pong_cache[0]
            if parts[0] != time:
                parts = pong_parts(time)
            _, fmt_int, tail = parts
            if data[0] == 0x23:       # a read that is exactly one canonical PING (the common case)
                pong = self.pong_one(data, time)
                if pong is not None:
                    out.append(pong)
                    return []
        events: list[Event] = []
        try:
            pos = self._complete_pending(data, events) if self._pending_len else 0
            version = self.version
            if version is _UNKNOWN:
                version = self._detect(data, pos)
            n = len(data)
            if version is _V3:
                unpack = _unpack_from
                loads = _loads
                fast = _V3_FAST
                maxsize = self.max_message_size
                expected = self.rx_seq
                tx = self.tx_seq
                busy = self._frag_size or self._discarding
                run = True            # try answer_run on the first canonical PING
                last = n - 5          # the last offset where a header can start
                try:
                    while pos <= last:
                        t, seq, ln = unpack(data, pos)
                        start = pos + 5
                        end = start + ln
                        if end > n:
                            break
                        if seq != expected and (seq or expected != 0x10000):  # (wrap: 65535 -> 0)
                            raise _seq_error(expected & 0xFFFF, seq)
                        expected = seq + 1      # masked once, when stored
                        mt = fast[t]
                        if mt is None or busy or ln > maxsize:
                            event = self._v3_slow(t, seq, data[start:end])
                            if event is not None:
                                events.append(event)
                            busy = self._frag_size or self._discarding
                        else:
                            if mt is ping and ln <= CANON_PING_MAX and data[end - 1] == 0x7D \
                                    and data.startswith(b'{"id":', start, end):
                                # the canonical PING, b'{"id":N}' as orjson writes it: answered
                                # without building the object (the same outcome as below, faster)
                                if run and n - pos >= MIN_RUN * (ln + 5):  # a run may follow
                                    k = answer_run(data, pos, ln, seq, tx, tail, out)
                                    if k:       # k PINGs answered at once (C-level struct work)
                                        expected = seq + k
                                        tx = (tx + k) & 0xFFFF
                                        pos += k * (ln + 5)
                                        continue
                                    run = False     # not a clean run: frame by frame from here
                                digits = data[start + 6:end - 1]
                                if digits.isdigit() and (ln == 8 or digits[0] != 0x30):
                                    pong = RE_PREFIX + digits + tail
                                    out.append(_pack(_PONG, tx, len(pong)) + pong)
                                    tx = (tx + 1) & 0xFFFF
                                    pos = end
                                    continue
                            try:
                                body = loads(data[start:end])
                            except _JSONDecodeError as exc:
                                events.append(json_error(mt, seq, data[start:end], exc))
                            else:
                                if type(body) is not dict:
                                    events.append(not_object(mt, seq, body))
                                else:
                                    if mt is ping:
                                        rid = body.get("id")
                                        if type(rid) is int and rid >= 0:
                                            pong = fmt_int % rid
                                        elif type(rid) is str and 0 < len(rid) <= MAX_ID_CHARS:
                                            pong = RE_PREFIX + _dumps(rid) + tail
                                        else:
                                            pong = None  # reported: the caller answers the error
                                        if pong is not None:
                                            out.append(_pack(_PONG, tx, len(pong)) + pong)
                                            tx = (tx + 1) & 0xFFFF
                                            pos = end
                                            continue
                                    msg = _new(Message)  # no __init__ call: one Python frame less
                                    msg.type = mt
                                    msg.body = body
                                    msg.seq = seq
                                    events.append(msg)
                        pos = end
                finally:
                    self.rx_seq = expected & 0xFFFF
                    self.tx_seq = tx
            elif version is _V2:
                pos, self.rx_seq, self.tx_seq = self.v2.parse(data, pos, events, self.max_message_size,
                                                              self.rx_seq, self.tx_seq, self._heartbeats)
            if pos < n:
                self._pending.append(data[pos:])
                self._pending_len += n - pos
            # (with nothing pending, _v3_slow already keeps _frag_size within max_buffer_size)
            if self._pending_len and self._pending_len + self._frag_size > self.max_buffer_size:
                raise ProtocolError(
                    ErrorCode.BUFFER_OVERFLOW,
                    f"{self.bytes_buffered} bytes buffered, over max_buffer_size "
                    f"({self.max_buffer_size})", fatal=True)
        except ProtocolError as exc:
            self.close()
            exc.events = events
            raise
        self._ping_ok = self.version is _V3 and not (self._pending_len or self._frag_size or self._discarding)
        return events

    def _on_eof(self) -> list[Event]:
        self._eof = True
        self._ping_ok = False
        if self._pending_len or self._frag_size or self._discarding:
            if self._pending_len:
                detail = f"in the middle of a frame ({self._pending_len} bytes of it received)"
            else:
                detail = "in the middle of a fragmented message"
            self.close()
            raise closed_error(f"peer closed the connection {detail}")
        return []

    def _complete_pending(self, data: bytes, events: list[Event]) -> int:
        """Complete the carried-over partial frame from ``data``; return how much of data was used.

        The payload is assembled with a single join, however many reads it spanned.
        """
        pending = self._pending
        have = self._pending_len
        pos = 0
        if have < HEADER_SIZE:
            pos = HEADER_SIZE - have
            head = b"".join(pending) + data[:pos]
            pending[:] = [head]
            self._pending_len = len(head)
            if len(head) < HEADER_SIZE:
                return len(data)
            have = HEADER_SIZE
        t, seq, ln = _unpack_from(pending[0])
        need = HEADER_SIZE + ln - have
        if len(data) - pos < need:
            pending.append(data[pos:])
            self._pending_len += len(data) - pos
            return len(data)
        pending[0] = memoryview(pending[0])[HEADER_SIZE:]  # type: ignore[call-overload]
        pending.append(memoryview(data)[pos:pos + need])  # type: ignore[arg-type]
        payload = b"".join(pending)
        pending.clear()
        self._pending_len = 0
        self._one_frame(t, seq, payload, events)
        return pos + need

    def _one_frame(self, t: int, seq: int, payload: bytes, events: list[Event]) -> None:
        """Process one frame that was assembled from several reads."""
        if self.version is _UNKNOWN:
            self.version = _V3 if t == _HELLO else _V2
        if self.version is _V3:
            if seq != self.rx_seq:
                raise _seq_error(self.rx_seq, seq)
            self.rx_seq = (seq + 1) & 0xFFFF
            event = self._v3_slow(t, seq, payload)
            if event is not None:
                events.append(event)
            return
        expected = self.rx_seq
        self.rx_seq = (seq + 1) & 0xFFFF
        events.append(self.v2.frame(t, seq, payload, self.max_message_size, expected))

    def _detect(self, data: bytes, pos: int) -> ProtocolVersion:
        """Server, version still UNKNOWN: the first complete frame decides (HELLO -> V3, else V2).

        A TLS record header (0x16 0x03 0x00..0x04: a client connecting with TLS to a plain port) is
        refused before it is read as a v2 frame (type 0x16 is v2's SESSION_NEW: every such attempt
        made the user an empty session)."""
        if looks_like_tls(data, pos):
            raise ProtocolError(ErrorCode.UNSUPPORTED, TLS_ON_PLAIN_PORT, fatal=True)
        if len(data) - pos >= HEADER_SIZE:
            t, _, ln = _unpack_from(data, pos)
            if pos + HEADER_SIZE + ln <= len(data):
                self.version = _V3 if t == _HELLO else _V2
        return self.version

    def _v3_slow(self, t: int, seq: int, payload: bytes) -> Event | None:
        """FRAGMENT frames, final frames of fragmented messages, unknown codes, over-size frames."""
        ln = len(payload)
        if t == _FRAGMENT:
            if ln == 0:
                raise ProtocolError(ErrorCode.BAD_FRAGMENT,
                                    f"empty FRAGMENT frame (seq {seq})", fatal=True)
            if self._discarding:
                self._discard_size += ln
                return None
            size = self._frag_size + ln
            if size > self.max_message_size:
                self._discarding = True
                self._discard_size = size
                self._parts = []
                self._frag_size = 0
                return None
            if size > self.max_buffer_size:
                raise ProtocolError(ErrorCode.BUFFER_OVERFLOW,
                                    f"reassembly of {size} bytes is over max_buffer_size "
                                    f"({self.max_buffer_size})", fatal=True)
            self._parts.append(payload)
            self._frag_size = size
            return None
        size = self._frag_size + ln
        fragmented = False
        if self._discarding:
            size = self._discard_size + ln
            self._discarding = False
            self._discard_size = 0
            refusal, self._refusal = self._refusal, None
            if refusal is not None:
                return InvalidMessage(refusal, _V2_TYPE[t], seq)
        elif self._parts:
            self._parts.append(payload)
            payload = b"".join(self._parts)
            self._parts = []
            self._frag_size = 0
            fragmented = True
        if size > self.max_message_size:
            return InvalidMessage(ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"{type_name(t)} message of {size} bytes is over max_message_size "
                f"({self.max_message_size}); discarded", fatal=False), _V2_TYPE[t], seq)
        mt = _V3_FAST[t]
        if mt is None:
            binary = _V3_BINARY.get(t)
            if binary is not None:          # raw bytes: the body is the payload itself
                if fragmented:              # (§5.8: one frame, 1..MAX_DATA bytes of data)
                    return InvalidMessage(ProtocolError(
                        ErrorCode.INVALID_MESSAGE,
                        f"{binary.name} is a data frame: one frame, never fragmented (at most {MAX_DATA} "
                        f"bytes of data); a fragmented one of {size} bytes was dropped", fatal=False), binary, seq)
                return Message(binary, payload, seq)
            v2_only = _V2_ONLY.get(t)
            if v2_only is not None:         # (§4: v2 file types on v3; the payload is not read)
                return InvalidMessage(ProtocolError(
                    ErrorCode.UNSUPPORTED, f"{v2_only.name} is a v2 message type, not served on a v3 "
                    "connection", fatal=False), v2_only, seq)
            return InvalidMessage(ProtocolError(
                ErrorCode.UNKNOWN_TYPE, f"unknown type code {type_name(t)}", fatal=False), t, seq)
        return decode_body(mt, seq, payload)


def _seq_error(expected: int, seq: int) -> ProtocolError:
    return ProtocolError(ErrorCode.SEQ_MISMATCH, f"expected frame seq {expected}, got {seq}",
                         fatal=True)

"""The legacy v2 part of the receiver: frames are passed through with their raw payloads.

v2 peers number their frames but cannot be held to it (the original system did not), so a seq that
is not the expected one is only counted (``seq_anomalies``); FRAGMENT is fatal and a payload over
``max_message_size`` is skipped with a recoverable error. See docs/protocol.md §7.

A server whose v2 request worker is idle may let the receiver answer the heartbeats at the head of
a read itself (``Receiver.receive_and_heartbeat``): ``CHAT_TEXT "HEARTBEAT"`` is answered
``CHAT_TEXT "HEARTBEAT"`` (§7), and nothing else needs the worker, so no event is made for them.

``V2Receiver`` is an object the ``Receiver`` holds (not a base class): it keeps only what is v2's
own (the anomaly count); the sequence counters and the size limit are the receiver's, passed in
and handed back explicitly.
"""
from __future__ import annotations

from .codes import ErrorCode, MsgType, type_name
from .errors import ProtocolError
from .events import Event, InvalidMessage, Message
from .frame import HEADER

_FRAGMENT = int(MsgType.FRAGMENT)
_CHAT_TEXT = int(MsgType.CHAT_TEXT)
HEARTBEAT = b"HEARTBEAT"                # a v2 heartbeat: CHAT_TEXT with exactly this payload
_unpack_from = HEADER.unpack_from
_pack = HEADER.pack
_new = object.__new__                   # Message instances without a Python-level __init__ call
_MEMBERS = {int(m): m for m in MsgType}
#: v2: known codes -> MsgType member, unknown codes -> the raw int.
_V2_TYPE: tuple[int, ...] = tuple(_MEMBERS.get(i, i) for i in range(256))


class V2Receiver:
    """Parses v2 frames for a ``Receiver``; ``seq_anomalies`` counts frames with an unexpected seq."""

    __slots__ = ("seq_anomalies",)

    def __init__(self) -> None:
        self.seq_anomalies = 0

    def parse(self, data: bytes, pos: int, events: list[Event], maxsize: int, rx_seq: int, tx_seq: int,
              out: list[bytes] | None = None) -> tuple[int, int, int]:
        """Complete frames of ``data`` from ``pos`` into ``events``; returns (where parsing stopped,
        the next expected seq, the next outgoing seq). With ``out``, heartbeats before the first
        event are answered there (each takes an outgoing seq). A fatal ProtocolError (FRAGMENT)
        propagates: the receiver closes, so the counters are not needed any more."""
        n = len(data)
        append = events.append
        unpack = _unpack_from
        types = _V2_TYPE
        new = _new
        message = Message
        expected = rx_seq
        anomalies = 0
        last = n - 5
        answer = out is not None and not events and maxsize >= 9  # (after an event they must wait)
        tx = tx_seq
        try:
            while pos <= last:
                t, seq, ln = unpack(data, pos)
                start = pos + 5
                end = start + ln
                if end > n:
                    break
                if seq != expected and (seq or expected != 0x10000):  # (wrapped: 65535 -> 0)
                    anomalies += 1
                expected = seq + 1              # masked once, at the end
                if answer:
                    if t == _CHAT_TEXT and ln == 9 and data.startswith(HEARTBEAT, start):
                        out.append(_pack(_CHAT_TEXT, tx, 9) + HEARTBEAT)  # type: ignore[union-attr]
                        tx = (tx + 1) & 0xFFFF
                        pos = end
                        continue
                    answer = False              # the rest waits behind this request, in order
                if t == 127 or ln > maxsize:    # FRAGMENT (0x7F) or over the cap
                    append(too_large_or_fragment(t, seq, ln, maxsize))
                else:
                    msg = new(message)
                    msg.type = types[t]
                    msg.body = data[start:end]
                    msg.seq = seq
                    append(msg)
                pos = end
        finally:
            self.seq_anomalies += anomalies
        return pos, expected & 0xFFFF, tx

    def frame(self, t: int, seq: int, payload: bytes, maxsize: int, rx_seq: int) -> Event:
        """One frame assembled from several reads, ``rx_seq`` being the seq that was expected."""
        if seq != rx_seq:
            self.seq_anomalies += 1
        if t == _FRAGMENT or len(payload) > maxsize:
            return too_large_or_fragment(t, seq, len(payload), maxsize)
        return Message(_V2_TYPE[t], payload, seq)


def too_large_or_fragment(t: int, seq: int, ln: int, maxsize: int) -> InvalidMessage:
    """v2: FRAGMENT is fatal (raised); a payload over ``maxsize`` is skipped (returned)."""
    if t == _FRAGMENT:
        raise ProtocolError(ErrorCode.BAD_FRAGMENT, "FRAGMENT frame on a v2 connection", fatal=True)
    return InvalidMessage(ProtocolError(
        ErrorCode.MESSAGE_TOO_LARGE, f"{type_name(t)} payload of {ln} bytes is over "
        f"max_message_size ({maxsize}); discarded", fatal=False), _V2_TYPE[t], seq)

"""PONG payloads for the PINGs the receiver answers itself (``Connection.receive_and_pong``).

The reply to ``PING {"id"}`` is ``PONG {"re": id, "time": time}`` (docs/protocol.md §5.5). Its bytes
are built from pieces cached per ``time`` (a server's clock string changes at most once per
millisecond), and are the same bytes ``orjson.dumps({"re": id, "time": time})`` gives.
"""
from __future__ import annotations

import orjson

MAX_PONG_TIME_CHARS = 256       # sanity bound on the "time" given to receive_and_pong
MAX_ID_CHARS = 64               # docs/protocol.md §3 (the same as protocol.messages.MAX_ID_CHARS)
#: the longest b'{"id":N}' the canonical PING path takes: N of at most 19 digits is always below
#: 2**64, which orjson reads as an int (longer numbers go through orjson, which may give a float)
CANON_PING_MAX = len(b'{"id":}') + 19
RE_PREFIX = b'{"re":'

PongParts = tuple[str, bytes, bytes]   # (time, %-format for an int id, tail after the id's JSON)


def _build(time: str) -> PongParts:
    if type(time) is not str or len(time) > MAX_PONG_TIME_CHARS:
        raise ValueError(f"PONG time must be a str of at most {MAX_PONG_TIME_CHARS} characters, "
                         f"got {time!r:.80}")
    tail = b',"time":' + orjson.dumps(time) + b"}"
    return time, RE_PREFIX + b"%d" + tail.replace(b"%", b"%%"), tail


#: one entry, replaced as a whole (a tuple), so threads sharing it never see a torn entry
cache: list[PongParts] = [_build("")]


def pong_parts(time: str) -> PongParts:
    """The pieces for ``time``, built and cached (ValueError if ``time`` is not a short str)."""
    parts = _build(time)
    cache[0] = parts
    return parts

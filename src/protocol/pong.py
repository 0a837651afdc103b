"""PONG payloads for the PINGs the receiver answers itself (``Connection.receive_and_pong``).

The reply to ``PING {"id"}`` is ``PONG {"re": id, "time": time}`` (docs/protocol.md §5.5). Its bytes
are built from pieces cached per ``time`` (a server's clock string changes at most once per
millisecond), and are the same bytes ``orjson.dumps({"re": id, "time": time})`` gives.

``answer_run`` answers a whole run of canonical PINGs of one size (a client keeping several PINGs in
flight sends them back to back) with a few C-level struct and tuple operations instead of a Python
loop iteration per frame; the receiver falls back to its frame loop whenever the run is not exactly
that.
"""
from __future__ import annotations

from struct import Struct

import orjson

from .fields import MAX_ID_CHARS  # noqa: F401 (re-exported for the receiver) docs/protocol.md §3 (defined once, with the field checks)

MAX_PONG_TIME_CHARS = 256       # sanity bound on the "time" given to receive_and_pong
#: the longest b'{"id":N}' the canonical PING path takes: N of at most 19 digits is always below
#: 2**64, which orjson reads as an int (longer numbers go through orjson, which may give a float)
CANON_PING_MAX = len(b'{"id":}') + 19
RE_PREFIX = b'{"re":'
ID_PREFIX = b'{"id":'
PING_CODE, PONG_CODE = 0x23, 0x24   # protocol.codes MsgType.PING / PONG (checked by the tests)
MIN_RUN = 5                     # below this many frames the receiver's loop is as fast
MAX_RUN = 256                   # frames answered per answer_run call (bounds the cached formats)
MAX_RUN_FORMATS = 1024          # cached (frames, digits, tail length) formats; cleared when full

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


# (frames, digits, tail length) -> (reader, expected types, lengths, prefixes, braces, writer, args)
_RunFormats = tuple[Struct, tuple, tuple, tuple, tuple, Struct, list]
_run_formats: dict[tuple[int, int, int], _RunFormats] = {}


def _formats(k: int, dl: int, tl: int) -> _RunFormats:
    if len(_run_formats) >= MAX_RUN_FORMATS:
        _run_formats.clear()
    f = _run_formats[(k, dl, tl)] = (
        Struct(">" + f"BHH6s{dl}s1s" * k), (PING_CODE,) * k, (7 + dl,) * k, (ID_PREFIX,) * k,
        (b"}",) * k, Struct(">" + f"BHH6s{dl}s{tl}s" * k), [PONG_CODE, 0, 6 + dl + tl, RE_PREFIX, 0, 0] * k)
    return f


def answer_run(data: bytes, pos: int, ln: int, rx: int, tx: int, tail: bytes, out: list[bytes]) -> int:
    """Answer the canonical PINGs of ``ln`` payload bytes that fill ``data`` from ``pos``; return how many.

    The frame at ``pos`` has type PING and a payload of ``ln`` bytes (8 to CANON_PING_MAX) and seq
    ``rx``. The run is the most whole frames of that size that fit in ``data`` (at most MAX_RUN); it is
    answered only if every one of them is ``PING {"id":N}`` exactly as orjson writes it (N digits, no
    leading zero) with seqs ``rx, rx+1, ...`` (no wrap inside the run): then the PONGs, seqs ``tx, ...``,
    are appended to ``out`` as one bytes object and the count is returned. Otherwise nothing changes
    and 0 is returned (so is a run of fewer than MIN_RUN frames, or one whose seqs would wrap): the
    caller's frame loop handles those frames one by one.
    """
    size = 5 + ln
    k = min((len(data) - pos) // size, MAX_RUN)
    dl = ln - 7
    if k < MIN_RUN or dl < 1 or rx + k > 0x10000 or tx + k > 0x10000:
        return 0
    tl = len(tail)
    f = _run_formats.get((k, dl, tl)) or _formats(k, dl, tl)
    reader, types, lens, prefixes, braces, writer, args = f
    u = reader.unpack_from(data, pos)
    if u[0::6] != types or u[2::6] != lens or u[3::6] != prefixes or u[5::6] != braces \
            or u[1::6] != tuple(range(rx, rx + k)):
        return 0
    ids = u[4::6]
    digits = b"".join(ids)
    if not digits.isdigit() or (dl > 1 and 0x30 in digits[0::dl]):
        return 0
    args = args[:]
    args[1::6] = range(tx, tx + k)
    args[4::6] = ids
    args[5::6] = (tail,) * k
    out.append(writer.pack(*args))
    return k

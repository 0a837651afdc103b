"""Codec throughput: frames/s to encode and decode NPLT frames, beside a bare-framing baseline.

Baseline = bare ``struct.pack`` + concatenation to encode and ``struct.unpack_from`` + slicing to
decode the same frames, measured in the same run. The codec is measured with raw payloads
(``send_raw`` / a v2 connection: framing, seq numbering and checking, events) and with JSON (v3:
orjson encode/decode, object check). "bare+orjson" rows are a second reference: the baseline plus
orjson, i.e. the floor for any JSON codec. Target: codec >= 0.5x the bare baseline for small frames
(verdicts printed at the end): raw encode and raw decode (64K reads and one buffer) against the bare
baseline; JSON encode and decode against bare+orjson (orjson alone decodes at ~0.3x of bare framing,
so no JSON codec could reach 0.5x of the bare baseline; their ratio to it is printed beside).
The "ping" rows are the server's hot path: PING frames in, PONG frames out, 1 or 16 per read, with
``receive_and_pong`` beside a bare echo (unpack, slice, pack a reply header around the payload).
Each function runs once untimed, then the implementations run round-robin; the best time is kept
(noise on a shared machine only ever adds time).

Run: .venv/bin/python bench/codec.py [--quick]    (--quick: fewer frames, best of 3 instead of 7)
"""
from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import orjson  # noqa: E402

from protocol import Connection, MsgType, ProtocolVersion, Role  # noqa: E402

HEADER = struct.Struct(">BHH")
CHUNK = 64 * 1024        # a typical socket read size for the "64K reads" decode rows


def small_body(i: int) -> dict:
    """An ANSWER_DELTA-like event of about 100 bytes of JSON."""
    return {"re": i, "session_id": "s_20261122_7f3a9c01d2e4", "turn_id": "t_9c01",
            "text": "the load average is", "offset": 1000 + i}


def large_body(i: int) -> dict:
    """About 60 KiB of JSON, still one frame."""
    return {"re": i, "content": "x" * (60 * 1024 - 40)}


def measure(fns: dict[str, Callable[[], object]], repeats: int) -> list[tuple[str, float, float]]:
    """Best time of each function, run round-robin so that load changes hit all of them alike.

    Returns (name, seconds, seconds of the first function = the baseline).
    """
    for fn in fns.values():  # warm-up
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    base = next(iter(best.values()))
    return [(name, seconds, base) for name, seconds in best.items()]


def bare_encode(payloads: list[bytes], type_code: int = 0x34) -> list[bytes]:
    pack = HEADER.pack
    out = []
    append = out.append
    seq = 0
    for p in payloads:
        append(pack(type_code, seq, len(p)) + p)
        seq = (seq + 1) & 0xFFFF
    return out


def bare_encode_json(bodies: list[dict]) -> list[bytes]:
    pack = HEADER.pack
    dumps = orjson.dumps
    out = []
    append = out.append
    seq = 0
    for b in bodies:
        p = dumps(b)
        append(pack(0x34, seq, len(p)) + p)
        seq = (seq + 1) & 0xFFFF
    return out


def bare_decode_reads(reads: list[bytes], loads: Callable | None = None) -> int:
    """Bare decoding: unpack_from + slicing, a bytearray carrying partial frames between reads."""
    unpack = HEADER.unpack_from
    buf = bytearray()
    count = 0
    for data in reads:
        if buf:
            buf += data
            data = bytes(buf)
        out = []
        append = out.append
        pos, n = 0, len(data)
        last = n - 5
        if loads is None:
            while pos <= last:
                t, seq, ln = unpack(data, pos)
                start = pos + 5
                end = start + ln
                if end > n:
                    break
                append(data[start:end])
                pos = end
        else:
            while pos <= last:
                t, seq, ln = unpack(data, pos)
                start = pos + 5
                end = start + ln
                if end > n:
                    break
                append(loads(data[start:end]))
                pos = end
        buf = bytearray(data[pos:])
        count += len(out)
    return count


def codec_encode_raw(payloads: list[bytes]) -> list[bytes]:
    send = Connection(Role.CLIENT).send_raw
    return [send(0x34, p) for p in payloads]


def codec_encode_json(bodies: list[dict]) -> list[bytes]:
    send = Connection(Role.CLIENT).send
    answer_delta = MsgType.ANSWER_DELTA   # enum attribute lookups cost ~100 ns on Python 3.11
    return [send(answer_delta, b) for b in bodies]


def codec_decode_reads(reads: list[bytes], version: ProtocolVersion) -> int:
    conn = Connection(Role.SERVER, version=version)
    count = 0
    for data in reads:
        count += len(conn.receive_data(data))
    return count


def bare_echo_reads(reads: list[bytes]) -> int:
    """Bare PING echo: unpack + slice + a reply header packed around the payload, one join per read."""
    unpack, pack = HEADER.unpack_from, HEADER.pack
    seq = count = 0
    for data in reads:
        out = []
        append = out.append
        pos, n = 0, len(data)
        last = n - 5
        while pos <= last:
            t, _, ln = unpack(data, pos)
            start = pos + 5
            end = start + ln
            if end > n:
                break
            append(pack(0x24, seq, ln) + data[start:end])
            seq = (seq + 1) & 0xFFFF
            pos = end
        count += len(out)
        b"".join(out)
    return count


def codec_pong_reads(reads: list[bytes]) -> int:
    conn = Connection(Role.SERVER, version=ProtocolVersion.V3)
    receive = conn.receive_and_pong
    time = "2026-11-22T10:15:00.123456+00:00"
    count = 0
    for data in reads:
        out: list[bytes] = []
        before = conn.tx_seq
        if receive(data, time, out):
            raise AssertionError("every PING should have been answered")
        count += (conn.tx_seq - before) & 0xFFFF     # (a run of PINGs is answered as one bytes object)
        b"".join(out)
    return count


def run_ping(count: int, repeats: int) -> list[tuple]:
    """PING frames answered, 1 or 16 per read; ``{"id":N}`` as orjson writes it, and spaced out."""
    rows = []
    for spelling, fmt in (("", b'{"id":%d}'), (", spaced", b'{"id": %d}')):
        frames = bare_encode([fmt % i for i in range(count)], 0x23)  # PING
        stream_len = sum(map(len, frames))
        for per_read in (1, 16):
            reads = [b"".join(frames[i:i + per_read]) for i in range(0, count, per_read)]
            assert codec_pong_reads(reads) == bare_echo_reads(reads) == count
            fns = {f"bare echo, {per_read}/read{spelling}": lambda reads=reads: bare_echo_reads(reads),
                   f"codec receive_and_pong, {per_read}/read{spelling}":
                       lambda reads=reads: codec_pong_reads(reads)}
            rows += [(name, seconds, base, stream_len) for name, seconds, base in measure(fns, repeats)]
    return [("ping ~10 B", "answer", name, count / sec, size / sec / 1e6, base / sec)
            for name, sec, base, size in rows]


def run(label: str, count: int, make_body: Callable[[int], dict], repeats: int) -> list[tuple]:
    bodies = [make_body(i) for i in range(count)]
    payloads = [orjson.dumps(b) for b in bodies]
    stream = b"".join(bare_encode(payloads))
    chunks = [stream[i:i + CHUNK] for i in range(0, len(stream), CHUNK)]
    assert codec_decode_reads(chunks, ProtocolVersion.V3) == count
    assert bare_decode_reads(chunks) == count
    assert b"".join(codec_encode_raw(payloads)) == stream
    encode = {
        "bare baseline": lambda: bare_encode(payloads),
        "bare+orjson": lambda: bare_encode_json(bodies),
        "codec raw (send_raw)": lambda: codec_encode_raw(payloads),
        "codec JSON (v3 send)": lambda: codec_encode_json(bodies),
    }
    rows = [(label, "encode", name, seconds, base)
            for name, seconds, base in measure(encode, repeats)]
    for reads, feed in (("one buffer", [stream]), ("64K reads", chunks)):
        decode = {
            f"bare baseline, {reads}": lambda feed=feed: bare_decode_reads(feed),
            f"bare+orjson, {reads}": lambda feed=feed: bare_decode_reads(feed, orjson.loads),
            f"codec raw (v2), {reads}": lambda feed=feed: codec_decode_reads(feed, ProtocolVersion.V2),
            f"codec JSON (v3), {reads}": lambda feed=feed: codec_decode_reads(feed, ProtocolVersion.V3),
        }
        rows += [(label, "decode", name, seconds, base)
                 for name, seconds, base in measure(decode, repeats)]
    return [(label, op, name, count / sec, len(stream) / sec / 1e6, base / sec)
            for label, op, name, sec, base in rows]


TARGET = 0.5             # codec / baseline for small frames


# The small-frame rows the target covers: (what, op, codec row, reference row; None = the bare baseline)
TARGET_ROWS = (
    ("raw encode (send_raw)", "encode", "codec raw (send_raw)", None),
    ("raw decode, 64K reads", "decode", "codec raw (v2), 64K reads", None),
    ("raw decode, one buffer", "decode", "codec raw (v2), one buffer", None),
    ("JSON encode (v3 send)", "encode", "codec JSON (v3 send)", "bare+orjson"),
    ("JSON decode, 64K reads", "decode", "codec JSON (v3), 64K reads", "bare+orjson, 64K reads"),
    ("JSON decode, one buffer", "decode", "codec JSON (v3), one buffer", "bare+orjson, one buffer"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer frames, best of 3 runs instead of 7")
    quick = ap.parse_args().quick
    repeats = 3 if quick else 7
    rows = run("small ~100 B", 5_000 if quick else 50_000, small_body, repeats)
    rows += run("large 60 KiB", 50 if quick else 300, large_body, repeats)
    rows += run_ping(5_000 if quick else 32_000, repeats)
    print(f"NPLT codec benchmark (Python {sys.version.split()[0]}, orjson {orjson.__version__}), "
          f"best of {repeats}")
    print(f"{'frames':<13} {'op':<7} {'implementation':<40} {'frames/s':>12} {'MB/s':>9} {'x baseline':>10}")
    for label, op, name, fps, mbs, ratio in rows:
        print(f"{label:<13} {op:<7} {name:<40} {fps:>12,.0f} {mbs:>9,.1f} {ratio:>10.2f}")
    small = {(op, name): ratio for label, op, name, _, _, ratio in rows if label.startswith("small")}
    ping = {name: ratio for label, _, name, _, _, ratio in rows if label.startswith("ping")}
    print(f"PING answered in the codec (receive_and_pong) vs a bare echo: "
          f"{ping['codec receive_and_pong, 1/read']:.2f}x (1 per read), "
          f"{ping['codec receive_and_pong, 16/read']:.2f}x (16 per read)   (informational, no target)")
    print(f"\nsmall frames, target codec >= {TARGET}x its baseline:")
    ok = True
    for what, op, row, ref in TARGET_ROWS:
        bare = small[op, row]
        ratio = bare / small[op, ref] if ref else bare
        good = ratio >= TARGET
        ok &= good
        against = f"of bare+orjson (bare: {bare:.2f}x)" if ref else "of the bare baseline"
        print(f"  {what:<24} {ratio:5.2f}x {against:<32} {'ok' if good else 'MISS'}")
    print("targets met" if ok else "TARGETS MISSED")


if __name__ == "__main__":
    main()

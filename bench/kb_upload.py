"""Knowledge-base upload over loopback: MB/s of the v3 binary upload, and another client's PING latency
meanwhile (docs/protocol.md §5.8; issue 14: >= 100 MB/s with PING p99 < 50 ms).

    .venv/bin/python bench/kb_upload.py [--mib 64] [--runs 3] [--ingest-mib 2]

The server runs in a subprocess (this script with ``--serve``; uvloop when installed, as nplt-server).
``upload`` is KB_UPLOAD_BEGIN, then the bytes as KB_UPLOAD_DATA frames (1 MiB per write, waiting for
the socket to drain), timed until the server's KB_PROGRESS "receiving" reports the last byte written
(hashed and on disk). ``baseline`` is the same bytes written to a plain TCP sink in the same server
process (read and dropped): the ratio is what the protocol, hashing and file writes cost. A second
client sends a PING every 5 ms during each upload (and during an idle period first). ``ingest`` times
KB_UPLOAD_END (parse, chunk, index) of a smaller log file once.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

from benchclient import new_loop  # noqa: E402
from protocol import Connection, MsgType, Role  # noqa: E402
from protocol.binary import data_frames  # noqa: E402

MIB = 1 << 20


# ---------------------------------------------------------------- server side (subprocess)
async def serve(port_file: str, data_dir: str) -> None:
    from server.app import Server
    from server.config import ServerConfig
    cfg = ServerConfig.from_dict({"server": {"host": "127.0.0.1", "port": 0, "log_level": "warning"},
                                  "storage": {"root": data_dir}, "llm": {}})
    srv = Server(cfg)
    _, port = await srv.start()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while data := await reader.read(1 << 18):
            n += len(data)
        writer.write(str(n).encode())
        await writer.drain()
        writer.close()
    baseline = await asyncio.start_server(sink, "127.0.0.1", 0)
    Path(port_file).write_text(f"{port} {baseline.sockets[0].getsockname()[1]}")
    stop = asyncio.Event()
    import signal
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    baseline.close()
    await srv.stop()


# ---------------------------------------------------------------- clients
class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.codec = Connection(Role.CLIENT, max_message_size=64 << 20)
        self.ids = 0
        self.waiting: dict[int, asyncio.Future] = {}
        self.progress: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self.read())

    @classmethod
    async def open(cls, port: int) -> Conn:
        c = cls(*await asyncio.open_connection("127.0.0.1", port))
        await c.call(MsgType.HELLO, proto=3, client="bench-kb")
        return c

    async def read(self) -> None:
        while data := await self.reader.read(1 << 16):
            for m in self.codec.receive_data(data):
                if m.type in (MsgType.RESPONSE, MsgType.ERROR, MsgType.PONG):
                    fut = self.waiting.pop(m.body.get("re"), None)
                    if fut is not None:
                        fut.set_result(m)
                elif m.type == MsgType.KB_PROGRESS:
                    self.progress.put_nowait(m.body)

    async def call(self, t: MsgType, **body) -> dict:
        self.ids += 1
        body["id"] = self.ids
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.ids] = fut
        self.writer.write(self.codec.send(t, body))
        m = await fut
        if m.type == MsgType.ERROR:
            raise RuntimeError(f"{m.body['code']}: {m.body['message']}")
        return m.body

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()


async def pinger(port: int, stop: asyncio.Event, rtts: list[float]) -> None:
    c = await Conn.open(port)
    while not stop.is_set():
        t0 = time.perf_counter()
        await c.call(MsgType.PING)
        rtts.append(time.perf_counter() - t0)
        try:
            await asyncio.wait_for(stop.wait(), 0.005)
        except asyncio.TimeoutError:
            pass
    await c.close()


async def upload(port: int, name: str, blob: bytes) -> float:
    """Seconds from the first byte sent to the server's report that the last one is written."""
    c = await Conn.open(port)
    begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(blob), md5=hashlib.md5(blob).hexdigest())
    view = memoryview(blob)
    t0 = time.perf_counter()
    for off in range(0, len(blob), MIB):
        c.writer.write(b"".join(data_frames(c.codec.send_raw, MsgType.KB_UPLOAD_DATA, begin["handle"], off,
                                            view[off:off + MIB])))
        await c.writer.drain()
    while (await c.progress.get())["done"] < len(blob):
        pass
    dt = time.perf_counter() - t0
    await c.close()
    return dt


async def baseline(port: int, blob: bytes) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    view = memoryview(blob)
    t0 = time.perf_counter()
    for off in range(0, len(blob), MIB):
        writer.write(view[off:off + MIB])
        await writer.drain()
    writer.write_eof()
    assert int(await reader.read()) == len(blob)
    dt = time.perf_counter() - t0
    writer.close()
    return dt


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


async def run(port: int, sink_port: int, mib: int, runs: int, ingest_mib: float) -> None:
    line = b"2026-11-25T12:00:00Z worker-7 INFO request served in 12 ms, queue depth 3, id %08d\n"
    blob = b"".join(line % i for i in range(mib * MIB // len(line % 0) + 1))[:mib * MIB]
    idle: list[float] = []
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(pinger(port, stop, idle))
    await asyncio.sleep(1.0)
    stop.set()
    await task
    print(f"ping idle: p50 {pct(idle, .5):.2f} ms  p99 {pct(idle, .99):.2f} ms  ({len(idle)} pings)")
    for r in range(runs):
        base = await baseline(sink_port, blob)
        rtts: list[float] = []
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(pinger(port, stop, rtts))
        dt = await upload(port, f"bench-{r}-{os.getpid()}.log", blob + str(r).encode())
        stop.set()
        await task
        print(f"run {r + 1}: baseline {mib / base:7.1f} MB/s   upload {mib / dt:7.1f} MB/s   ratio {base / dt:.2f}   "
              f"ping during upload p50 {pct(rtts, .5):.2f} ms  p99 {pct(rtts, .99):.2f} ms  ({len(rtts)} pings)")
    if ingest_mib:
        small = blob[:int(ingest_mib * MIB)]
        c = await Conn.open(port)
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="ingest.log", size=len(small),
                             md5=hashlib.md5(small).hexdigest())
        t0 = time.perf_counter()
        for f in data_frames(c.codec.send_raw, MsgType.KB_UPLOAD_DATA, begin["handle"], 0, small):
            c.writer.write(f)
        doc = (await c.call(MsgType.KB_UPLOAD_END, upload_id=begin["upload_id"]))["document"]
        dt = time.perf_counter() - t0
        print(f"ingest: {len(small) / MIB:.1f} MiB log -> {doc['chunks']} chunks in {dt:.2f} s "
              f"({len(small) / MIB / dt:.2f} MB/s end to end)")
        await c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="upload size in MiB (at most 100: max_upload_bytes)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ingest-mib", type=float, default=2.0, help="also time END of a file this big (0: skip)")
    ap.add_argument("--serve", nargs=2, metavar=("PORT_FILE", "DATA_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=new_loop) as r:
            r.run(serve(*args.serve))
        return
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NPLT_")}
        proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), str(Path(tmp) / "data")], env=env)
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("server did not start")
                time.sleep(0.05)
            port, sink_port = map(int, port_file.read_text().split())
            with asyncio.Runner(loop_factory=new_loop) as r:
                r.run(run(port, sink_port, args.mib, args.runs, args.ingest_mib))
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()

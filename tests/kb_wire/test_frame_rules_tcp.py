"""Over loopback: a fragmented KB_UPLOAD_DATA is refused (INVALID_MESSAGE, "re": null) and the upload
keeps its state (§5.8: a data frame is one frame, never fragmented, 1..65523 bytes of data); a v2
file type on a v3 connection is UNSUPPORTED whatever its payload (§4)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from protocol import MsgType
from protocol.binary import DATA_HEADER

from kb_wire.kbwire import connect, kb_server, md5, send_data

ROWS = b"".join(b"row %06d fragmented data frame test\n" % i for i in range(5000))   # 190,000 bytes


async def test_a_fragmented_data_frame_is_refused_and_the_upload_goes_on(tmp_path: Path) -> None:
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        begin = await c.call(MsgType.KB_UPLOAD_BEGIN, name="rows.txt", size=len(ROWS), md5=md5(ROWS))
        handle = begin["handle"]
        # 100,000 bytes in one "data frame" that the codec fragments (FRAGMENT + KB_UPLOAD_DATA)
        c.send_bytes(c.codec.send(MsgType.KB_UPLOAD_DATA, DATA_HEADER.pack(handle, 0) + ROWS[:100_000]))
        err = await c.wait_type(MsgType.ERROR)
        assert err.body["re"] is None and err.body["code"] == "INVALID_MESSAGE" and not err.body["fatal"]
        assert "never fragmented" in err.body["message"]
        # nothing of it was taken: the upload continues from offset 0 on the same handle
        again = await c.call(MsgType.KB_UPLOAD_BEGIN, name="rows.txt", size=len(ROWS), md5=md5(ROWS))
        assert again["offset"] == 0 and again["upload_id"] == begin["upload_id"]
        send_data(c, again["handle"], 0, ROWS)
        doc = (await c.call(MsgType.KB_UPLOAD_END, upload_id=begin["upload_id"]))["document"]
        assert doc["size"] == len(ROWS) and doc["sha256"] == hashlib.sha256(ROWS).hexdigest()
        assert not [m for m in c.inbox if m.type == MsgType.ERROR]
        await c.close()


async def test_v2_file_types_on_v3_are_unsupported_before_their_payload_is_read(tmp_path: Path) -> None:
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for t, payload in [(MsgType.FILE_DATA, b"abc"), (MsgType.FILE_DATA, b'{"id": 5}'),
                           (MsgType.FILE_METADATA, b'{"filename": "a.txt", "size": 1}'),
                           (MsgType.DOWNLOAD_OFFER, b"{}"), (MsgType.CLIENT_UDP_PORT, b"\xff")]:
            c.send_bytes(c.codec.send_raw(t, payload))
            err = await c.wait_type(MsgType.ERROR)
            assert err.body == {"re": None, "code": "UNSUPPORTED", "fatal": False,
                                "message": f"{t.name} is a v2 message type, not served on a v3 connection"}
        assert (await c.call(MsgType.PING))["re"] is not None          # the connection goes on
        await c.close()

"""Review s33, deployed NPLT v2 clients: uploads that grow or pile up, refusals a v2 client can read,
names quoted back, the test client's CLIENT_UDP_PORT.

From the v2 file spec (the original system's, as its deployed clients speak it):

    FILE_METADATA (0x0E), JSON {"filename": "config.yaml", "size": 1234} (size in bytes).
    FILE_DATA (0x0D) frames carrying the raw bytes in order. [...] The upload is complete when
    `size` bytes have arrived.
    The server answers with one CHAT_TEXT (0x01) [...]
    At start the client binds a UDP socket and sends CLIENT_UDP_PORT (0x18), JSON {"udp_port": 50123}.
"""
from __future__ import annotations

import asyncio
import hashlib
import re
import socket
from pathlib import Path

import pytest

import server.legacy_v2_files as files
from protocol import MsgType, encode_frame
from server.auth import LOCAL_USER, hash_token
import server.conn_limits as conn_limits
from testkit.server import ReplyError, V3Client, poll, running_server
from testkit.v2client import CHAT_TEXT, HEADER, V2Client
from v2files_testlib import FILE_DATA, FILE_METADATA, connect, files_server, send_file

OK = re.compile(r"^文件上传成功: (?P<name>.+) \(ID: (?P<doc_id>[0-9a-f]{24})\)$")


def _log(n: int) -> bytes:
    """A log file's first ``n`` bytes (lines "2026-11-27 app.log line 00000")."""
    return b"".join(b"2026-11-27 app.log line %05d\n" % i for i in range(n // 20 + 1))[:n]


async def _in_step(v2: V2Client) -> None:
    """The next reply is the HEARTBEAT's: nothing else was pending (one reply per request)."""
    v2.send(CHAT_TEXT, "HEARTBEAT")
    assert await v2.recv_text() == "HEARTBEAT"


# -- 1. a file that grows while it is sent -------------------------------------------------------------
@pytest.mark.parametrize("announced, sent", [(10_050, 10_350),    # the excess shares a frame with the end
                                             (10_000, 10_400)])   # the size ends on a frame boundary
async def test_a_file_that_grew_during_its_upload_is_stored_at_its_size_with_one_reply(
        tmp_path: Path, announced: int, sent: int) -> None:
    async with files_server(tmp_path) as (srv, addr):
        v2 = await connect(addr)
        data = _log(sent)
        send_file(v2, "app.log.txt", data, size=announced)        # 200-byte pieces, as the deployed client
        m = OK.match(await v2.recv_text())
        assert m is not None and m["name"] == "app.log.txt"
        await _in_step(v2)                                           # no second reply for the excess
        [doc] = await srv.services.knowledge.list(LOCAL_USER, ())
        assert (doc.doc_id, doc.size, doc.md5) == (m["doc_id"], announced, hashlib.md5(data[:announced]).hexdigest())
        # more excess later, before the next upload: swallowed too; the next upload is served as usual
        v2.send(FILE_DATA, b"late line\n")
        send_file(v2, "next.txt", b"the next file\n")
        assert OK.match(await v2.recv_text())["name"] == "next.txt"
        await _in_step(v2)
        assert v2.only_v2_codes()
        await v2.close()


async def test_file_data_before_any_metadata_is_answered_once_per_connection(tmp_path: Path) -> None:
    async with files_server(tmp_path) as (srv, addr):
        v2 = await connect(addr)
        v2.send(FILE_DATA, b"stray")
        v2.send(FILE_DATA, b"stray again")
        assert (await v2.recv_text()).startswith("文件保存失败: FILE_DATA without FILE_METADATA")
        await _in_step(v2)
        v2.send(FILE_METADATA, b"not json")       # refused: the bytes it announced are then swallowed
        assert (await v2.recv_text()).startswith("文件保存失败: FILE_METADATA is not JSON")
        v2.send(FILE_DATA, b"the bytes of that upload")
        await _in_step(v2)
        await v2.close()


# -- 2. v2 uploads in progress count toward the upload limits ----------------------------------------------
def _reserved(srv) -> tuple[int, int]:
    return srv.services.uploads.reserved(LOCAL_USER)


async def test_v2_uploads_in_progress_count_toward_the_quota_and_upload_limits_of_both_protocols(
        tmp_path: Path) -> None:
    knowledge = {"user_quota_bytes": 1_000_000, "max_upload_bytes": 900_000, "max_uploads_per_user": 2}
    async with files_server(tmp_path, knowledge=knowledge) as (srv, addr):
        a = await connect(addr)
        send_file(a, "a.txt", b"a" * 1000, size=600_000)            # open: 600,000 bytes declared
        await poll(lambda: _reserved(srv) == (1, 600_000), what="the v2 upload counted")
        b = await connect(addr)
        send_file(b, "b.txt", b"b" * 1000, size=600_000)            # over the quota with a's: refused at once
        text = await b.recv_text()
        assert text.startswith("文件保存失败: b.txt: quota of 1000000 bytes would be exceeded") and "600000 asked" in text
        await _in_step(b)                                            # (its bytes swallowed without a reply)
        v3 = await V3Client.connect(addr)                            # a v3 BEGIN sees the v2 upload too
        md5 = hashlib.md5(b"x").hexdigest()
        with pytest.raises(ReplyError) as exc:
            await v3.call(MsgType.KB_UPLOAD_BEGIN, name="v3.txt", size=500_000, md5=md5)
        assert exc.value.body["code"] == "QUOTA_EXCEEDED" and "600000 reserved by 1 uploads" in exc.value.body["message"]
        send_file(b, "b2.txt", b"b" * 100, size=300_000)             # fits: the user's second upload
        await poll(lambda: _reserved(srv) == (2, 900_000), what="both v2 uploads counted")
        c = await connect(addr)
        send_file(c, "c.txt", b"tiny file\n")                        # a third: over max_uploads_per_user
        text = await c.recv_text()
        assert text.startswith("文件保存失败: c.txt: 2 uploads already in progress (max_uploads_per_user = 2)")
        # every end releases it: stored (a), replaced by a new metadata (b2), the connection closed (b3)
        for off in range(1000, 600_000, 60_000):
            a.send(FILE_DATA, b"a" * min(60_000, 600_000 - off))
        assert OK.match(await a.recv_text())["name"] == "a.txt"
        await poll(lambda: _reserved(srv) == (1, 300_000), what="a released once stored")
        send_file(b, "b3.txt", b"b" * 10, size=50_000)               # replaces b2 (answered), holds 50,000
        assert (await b.recv_text()).startswith("文件保存失败: b2.txt: a new upload started after 100 of 300000")
        await poll(lambda: _reserved(srv) == (1, 50_000), what="b2 released, b3 counted")
        await b.close()                                              # the connection closes mid-upload
        await poll(lambda: _reserved(srv) == (0, 0), what="b3 released at the disconnect")
        begin = await v3.call(MsgType.KB_UPLOAD_BEGIN, name="v3.txt", size=300_000, md5=md5)
        assert begin["size"] == 300_000                              # room again for a v3 upload
        for x in (a, c, v3):
            await x.close()


async def test_v2_uploads_count_toward_the_servers_max_uploads_until_they_time_out(tmp_path: Path) -> None:
    async with files_server(tmp_path, knowledge={"max_uploads": 1}, transfer={"v2_upload_timeout_s": 1.0}) as (srv, addr):
        a, b = await connect(addr), await connect(addr)
        send_file(a, "a.txt", b"a" * 10, size=1000)
        await poll(lambda: _reserved(srv) == (1, 1000), what="the v2 upload counted")
        send_file(b, "b.txt", b"b" * 10)
        assert await b.recv_text() == "文件保存失败: b.txt: 1 uploads in progress on the server (max_uploads); retry later"
        assert "timed out" in await a.recv_text()                    # a: no data for 1 s
        await poll(lambda: _reserved(srv) == (0, 0), what="released at the timeout")
        send_file(b, "b.txt", b"now it fits\n")
        assert OK.match(await b.recv_text())["name"] == "b.txt"
        await a.close()
        await b.close()


# -- 5. refusals a v2 client can read ------------------------------------------------------------------
async def _refused(addr: tuple[str, int], first: bytes | None) -> bytes:
    """Everything a raw client that sends ``first`` (None: nothing) reads until the server closes."""
    reader, writer = await asyncio.open_connection(*addr)
    if first is not None:
        writer.write(first)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def _text(text: str) -> bytes:
    return encode_frame(CHAT_TEXT, 0, text.encode())


async def test_a_v2_client_refused_for_a_full_server_or_its_address_reads_why(tmp_path: Path) -> None:
    v2_first = HEADER.pack(0x18, 0, 17) + b'{"udp_port":5000}'
    async with running_server(tmp_path, max_clients=1, legacy_grace_ms=100) as (srv, addr):
        v3 = await V3Client.connect(addr)
        full = _text("Server is full (1 clients); try again later.")
        assert await _refused(addr, v2_first) == full
        assert await _refused(addr, None) == full                     # silent: served as v2, so told as v2
        msg = await (await V3Client.connect(addr, hello=False)).request(MsgType.HELLO, proto=3, client="t")
        assert msg.type == MsgType.ERROR and msg.body["code"] == "SERVER_FULL"     # v3: as before
        assert await _refused(addr, b"\x16\x03\x01\x00\x05hello") == b""          # a TLS client: the close only
        await v3.close()
    async with running_server(tmp_path / "ip", max_clients_per_ip=1, legacy_grace_ms=100) as (srv, addr):
        v3 = await V3Client.connect(addr)
        assert await _refused(addr, v2_first) == _text(
            "Too many connections from 127.0.0.1 (max_clients_per_ip = 1); try again later.")
        await v3.close()


async def test_a_v2_client_in_the_admin_slot_reads_why(tmp_path: Path) -> None:
    users = {"auth": {"users": [{"user_id": "root", "token_sha256": hash_token("t-root"), "admin": True},
                                {"user_id": "bob", "token_sha256": hash_token("t-bob"), "admin": False}]}}
    async with running_server(tmp_path, max_clients=1, legacy_grace_ms=100, sections=users) as (srv, addr):
        bob = await V3Client.connect(addr, token="t-bob")
        assert await _refused(addr, encode_frame(CHAT_TEXT, 0, b"hi")) == _text(
            "Server is full (1 clients; the one slot beyond is reserved for an admin); try again later.")
        await bob.close()


async def test_bytes_that_are_no_tls_record_on_a_tls_port_get_a_plain_v2_text() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    loop = asyncio.get_running_loop()

    async def first_read(data: bytes | None, timeout: float = 5.0) -> tuple[bytes | None, bytes]:
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        sock, _ = await loop.sock_accept(listener)
        try:
            if data is not None:
                writer.write(data)
            reply = await conn_limits.plain_on_tls_reply(sock, timeout)
            sock.setblocking(True)
            sock.settimeout(5)
            kept = sock.recv(64, socket.MSG_PEEK) if data is not None else b""   # left for the TLS handshake
            if reply is not None:        # what the client reads: that text, then the close
                sock.setblocking(False)
                conn_limits.reply_plain_and_close(sock, reply)
                assert await asyncio.wait_for(reader.read(), 5) == reply
            return reply, kept
        finally:
            sock.close()
            writer.close()

    try:
        v2 = HEADER.pack(0x18, 0, 17) + b'{"udp_port":5000}'
        requires_tls = _text(conn_limits.REQUIRES_TLS)
        assert requires_tls.startswith(HEADER.pack(CHAT_TEXT, 0, len(requires_tls) - 5) + b"This server requires TLS")
        assert await first_read(v2) == (requires_tls, v2)
        assert await first_read(b"GET / HTTP/1.1\r\n\r\n") == (requires_tls, b"GET / HTTP/1.1\r\n\r\n")
        hello = encode_frame(MsgType.HELLO, 0, b'{"id":1,"proto":3}')
        assert await first_read(hello) == (None, hello)              # v3: the handshake goes on (fails)
        tls = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
        assert await first_read(tls) == (None, tls)                  # a ClientHello: the handshake goes on
        assert await first_read(None, timeout=0.2) == (None, b"")    # silent: maybe a slow TLS client
    finally:
        listener.close()


# -- 6. / 8. refusals quote names so they can be told apart ----------------------------------------------
async def test_documents_sharing_a_name_are_listed_with_size_time_and_md5(tmp_path: Path) -> None:
    async with files_server(tmp_path) as (srv, addr):
        kb = srv.services.knowledge
        old = await kb.ingest(LOCAL_USER, (), None, "runbook.md", b"# Runbook\n\nRestart nginx.\n")
        new = await kb.ingest(LOCAL_USER, (), None, "runbook.md", b"# Runbook\n\nRestart nginx, then php.\n")
        with pytest.raises(Exception) as exc:
            await srv.services.offers.find(LOCAL_USER, (), name="runbook.md")
        message = exc.value.message
        assert "2 different documents are named 'runbook.md'" in message
        for d in (old, new):
            assert (f"{d.doc_id} ({d.collection}, {d.size} bytes, uploaded {d.uploaded_at[:19].replace('T', ' ')}, "
                    f"MD5 {d.md5[:8]})") in message
        with pytest.raises(Exception) as exc:
            await srv.services.offers.find(LOCAL_USER, (), name="run\tbook\u200b.md")
        assert "'run\\tbook\\u200b.md'" in exc.value.message and "\t" not in exc.value.message
        assert "\u200b" not in exc.value.message


async def test_an_upload_refusal_quotes_a_hostile_name_escaped(tmp_path: Path) -> None:
    async with files_server(tmp_path) as (srv, addr):
        v2 = await connect(addr)
        for name, shown in (("a\u200b.txt", "'a\\u200b.txt'"), ("tab\t.txt", "'tab\\t.txt'"),
                            ("bidi\u202etxt.exe", "'bidi\\u202etxt.exe'")):
            send_file(v2, name, b"some text\n")
            text = await v2.recv_text()
            assert text.startswith(f"文件保存失败: {shown}: "), text
            assert text.isprintable(), text
        send_file(v2, "plain name.exe", b"MZ")                         # a printable name: as it is
        assert (await v2.recv_text()).startswith("文件保存失败: plain name.exe: ")
        await v2.close()


# -- 7. the test client announces its UDP port as the spec says ------------------------------------------
async def test_the_test_client_announces_its_udp_port_in_json(tmp_path: Path) -> None:
    async with files_server(tmp_path) as (srv, addr):
        v2, welcome = await V2Client.connect(addr, udp_port=40123)    # CLIENT_UDP_PORT first, then the welcome
        assert welcome.startswith("Welcome to NPLT Assistant")
        [conn] = srv.services.connections
        await poll(lambda: files.files_of(conn.legacy).udp_port == 40123, what="the port registered")
        assert conn.legacy in srv.services.offers._v2
        await v2.close()

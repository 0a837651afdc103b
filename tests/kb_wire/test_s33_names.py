"""Review s33: a knowledge-base upload name whose last part is empty, "." or ".." is INVALID_MESSAGE
(docs/protocol.md §5.8, docs/knowledge.md), for v3 uploads and v2 ones alike.

Before, the base name was taken with ``PurePosixPath(name).name``, which normalises the path first:
"y.md/" and "w.md//" were stored as "y.md" / "w.md", and "x/", "dir/", "a/.", "C:\\x\\" were
checked as "x", "dir", "a", "x" and refused UNSUPPORTED_MEDIA (no extension) instead.
"""
from __future__ import annotations

import pytest

from kb_v2.v2files_testlib import connect as v2_connect
from kb_v2.v2files_testlib import files_server, send_file
from kb_wire.kbwire import connect, kb_server, md5, raw_upload
from protocol import MsgType
from server.errors import HandlerError
from server.knowledge.names import clean_name, last_part
from testkit.server import ReplyError

EMPTY_LAST_PART = ["x/", "dir/", "y.md/", "w.md//", "a/.", "a/..", "C:\\x\\", "notes\\", "/", ".", "..",
                   "a/ ", "docs/ . "]


@pytest.mark.parametrize("name", EMPTY_LAST_PART)
def test_a_last_part_that_is_empty_dot_or_dotdot_is_invalid(name):
    with pytest.raises(HandlerError) as exc:
        clean_name(name)
    assert exc.value.code == "INVALID_MESSAGE", exc.value
    assert "its last part is empty, '.' or '..'" in exc.value.message


@pytest.mark.parametrize("name, base", [("sub/z.md", "z.md"), ("a\\b.md", "b.md"), ("../../etc/x.txt", "x.txt"),
                                        ("C:\\docs\\plan.md", "plan.md"), ("./notes.md", "notes.md"),
                                        ("a/./b.md", "b.md")])
def test_the_folders_are_still_dropped(name, base):
    assert clean_name(name) == base


def test_last_part_is_not_normalised():
    assert [last_part(n) for n in ("y.md/", "a/.", "a\\b", "plain.md")] == ["", ".", "b", "plain.md"]


async def test_v3_begin_refuses_them_and_stores_nothing(tmp_path):
    data = b"# notes\n\nthe proxy restarts at night\n"
    async with kb_server(tmp_path) as (srv, addr):
        c = await connect(addr, "alice")
        for name in ("y.md/", "w.md//", "x/", "dir/", "a/.", "C:\\x\\"):
            with pytest.raises(ReplyError) as exc:
                await c.call(MsgType.KB_UPLOAD_BEGIN, name=name, size=len(data), md5=md5(data))
            assert exc.value.code == "INVALID_MESSAGE", (name, exc.value.body)
            assert "last part is empty" in exc.value.body["message"]
        assert (await c.call(MsgType.KB_LIST))["documents"] == []
        ok = await raw_upload(c, "sub/z.md", data)              # a folder is still dropped
        assert ok["document"]["name"] == "z.md"
        await c.close()


async def test_v2_upload_is_refused_with_the_same_reason(tmp_path):
    async with files_server(tmp_path) as (srv, addr):
        v2 = await v2_connect(addr)
        send_file(v2, "notes.md/", b"the proxy restarts at night\n")   # refused at its metadata
        text = await v2.recv_text()
        assert text.startswith("文件保存失败: notes.md/: invalid file name 'notes.md/': its last part is empty"), text
        send_file(v2, "sub/next.txt", b"the next file\n")            # its bytes were swallowed: in step
        assert (await v2.recv_text()).startswith("文件上传成功: next.txt (ID: ")
        await v2.close()

"""read_log: tails files under the configured roots and rejects every escape."""
from __future__ import annotations

import os

import orjson
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig

CTX = ToolContext("alice", "s_1")


@pytest.fixture
def root(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_text("".join(f"line {i}\n" for i in range(1000)))
    (logs / "sub").mkdir()
    (logs / "sub" / "worker.log").write_text("w1\nw2")          # no final newline
    (tmp_path / "secret.txt").write_text("top secret\n")
    return logs


def registry(*roots, **kw) -> ToolRegistry:
    return ToolRegistry(ToolsConfig(log_roots=[str(r) for r in roots], **kw))


async def read(tools, path, lines=None):
    args = {"path": str(path)} if lines is None else {"path": str(path), "lines": lines}
    call = await tools.run("read_log", args, CTX)
    return call.status, orjson.loads(call.result)


async def test_tail_last_lines(root):
    status, d = await read(registry(root), root / "app.log", 3)
    assert status == "success"
    assert d["text"] == "line 997\nline 998\nline 999"
    assert d["lines_returned"] == 3 and d["truncated"] is True and d["path"] == str(root / "app.log")
    status, d = await read(registry(root), "sub/worker.log", 10)     # relative to a root
    assert (status, d["text"], d["truncated"]) == ("success", "w1\nw2", False)


async def test_default_and_capped_lines(root):
    _, d = await read(registry(root, max_log_lines=20), "app.log")
    assert d["lines_returned"] == 20 and d["text"].endswith("line 999")
    status, d = await read(registry(root, max_log_lines=20), "app.log", 21)
    assert status == "error" and d["error"] == "argument 'lines': expected an integer in 1..20, got 21"


async def test_byte_cap_drops_the_cut_line(tmp_path):
    (tmp_path / "big.log").write_text("".join(f"{i:08d}\n" for i in range(10000)))   # 9 bytes per line
    _, d = await read(registry(tmp_path, max_log_bytes=1024, max_log_lines=1000), "big.log", 1000)
    lines = d["text"].split("\n")
    assert d["truncated"] is True and len(lines) == 113 and lines[-1] == "00009999"
    assert all(len(x) == 8 for x in lines)


async def test_empty_file(root):
    (root / "empty.log").write_text("")
    status, d = await read(registry(root), "empty.log")
    assert status == "success" and d["text"] == "" and d["lines_returned"] == 0


@pytest.mark.parametrize("path,message", [
    ("../secret.txt", "path '../secret.txt' must not contain '..' components"),
    ("sub/../../secret.txt", "path 'sub/../../secret.txt' must not contain '..' components"),
    ("/etc/passwd", "path '/etc/passwd' is outside the allowed log directories"),
    ("missing.log", "no such log file: 'missing.log'"),
    ("sub", "'sub' is a directory; read_log reads regular log files only"),
])
async def test_rejections(root, path, message):
    status, d = await read(registry(root), path)
    assert status == "error" and d == {"error": message}


async def test_absolute_paths_inside_and_outside(root, tmp_path):
    status, _ = await read(registry(root), root / "sub" / "worker.log")
    assert status == "success"
    status, d = await read(registry(root), tmp_path / "secret.txt")
    assert status == "error" and "outside the allowed log directories" in d["error"]
    status, d = await read(registry(root), str(root) + "-evil/x.log")        # prefix trick
    assert status == "error" and "outside" in d["error"]


async def test_symlink_escaping_the_root_is_rejected(root, tmp_path):
    os.symlink(tmp_path / "secret.txt", root / "escape.log")
    os.symlink(tmp_path, root / "up")
    for path in ("escape.log", root / "escape.log", "up/secret.txt"):
        status, d = await read(registry(root), path)
        assert status == "error" and "outside the allowed log directories" in d["error"], path
        assert "top secret" not in orjson.dumps(d).decode()


async def test_symlink_within_the_root_is_followed(root):
    os.symlink(root / "app.log", root / "current.log")
    status, d = await read(registry(root), "current.log", 1)
    assert status == "success" and d["text"] == "line 999" and d["path"] == str(root / "app.log")


async def test_fifo_and_directories_are_not_read(root):
    os.mkfifo(root / "pipe.log")
    status, d = await read(registry(root), "pipe.log")
    assert status == "error" and d["error"] == "'pipe.log' is not a regular file; read_log reads regular log files only"
    status, d = await read(registry(root), root)
    assert status == "error" and "is a directory" in d["error"]


async def test_disabled_without_roots(root):
    status, d = await read(ToolRegistry(ToolsConfig()), root / "app.log")
    assert status == "error" and "no log directories are configured" in d["error"]


async def test_nul_byte(root):
    status, d = await read(registry(root), "app.log\x00.txt")
    assert status == "error" and d["error"] == "path must not contain NUL bytes"


async def test_hardlink_to_a_file_outside_is_refused(root, tmp_path):
    os.link(tmp_path / "secret.txt", root / "linked.log")
    status, d = await read(registry(root), "linked.log")
    assert status == "error" and d == {"error": "'linked.log' has 2 hard links and is refused: a hard link may "
                                                "expose a file from outside the allowed directories"}
    assert "top secret" not in orjson.dumps(d).decode()


async def test_secret_names_and_pseudo_filesystems_are_refused(root):
    (root / "id_ed25519").write_text("key\n")
    status, d = await read(registry(root), "id_ed25519")
    assert status == "error" and d["error"].startswith("'id_ed25519' is refused: files named like")
    status, d = await read(registry(root), "/proc/self/environ")
    assert status == "error" and d["error"] == ("path '/proc/self/environ' is under /proc, a pseudo filesystem "
                                                "that is never readable")

"""list_dir, read_file and search_files: real files under a real root; every hostile argument is refused
precisely and the registry keeps answering."""
from __future__ import annotations

import os
import time

import orjson
import pytest

from server.tools import ToolContext, ToolRegistry, ToolsConfig

CTX = ToolContext("alice", "s_1")


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "files"
    (r / "sub").mkdir(parents=True)
    (r / "app.log").write_text("boot\nERROR disk full\nok\nerror: retry\n")
    (r / "sub" / "worker.log").write_text("w1\nERROR worker\n")
    (r / "config.yaml").write_text("port: 8080\nname: demo\n")
    (r / "image.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (r / ".env").write_text("DB_PASSWORD=envsecret\n")
    (r / "server.pem").write_text("-----BEGIN PRIVATE KEY-----\nMIIpem\n-----END PRIVATE KEY-----\n")
    (r / "id_rsa").write_text("rsa secret\n")
    (r / "tls.key").write_text("key secret\n")
    (r / "credentials").write_text("aws secret\n")
    (r / "shadow").write_text("root:$6$hash\n")
    (tmp_path / "outside.txt").write_text("outside secret\n")
    return r


def registry(*roots, **kw) -> ToolRegistry:
    return ToolRegistry(ToolsConfig(file_roots=[str(x) for x in roots], **kw))


async def run(tools, name, **args):
    call = await tools.run(name, args, CTX)
    return call.status, orjson.loads(call.result)


async def test_list_dir_entries_and_hidden_secrets(root):
    status, d = await run(registry(root), "list_dir", path=str(root))
    assert status == "success"
    assert [(e["name"], e["type"]) for e in d["entries"]] == [
        ("app.log", "file"), ("config.yaml", "file"), ("image.bin", "file"), ("sub", "dir")]
    app = d["entries"][0]
    assert app["bytes"] == len("boot\nERROR disk full\nok\nerror: retry\n") and app["size"].endswith("B")
    assert app["modified"][:4].isdigit()
    assert d["hidden"] == 6 and d["truncated"] is False


async def test_a_file_name_that_is_not_utf8_is_listed_escaped(root):
    odd = os.path.join(os.fsencode(root), b"caf\xe9\xff.txt")    # Latin-1 bytes: not UTF-8
    with open(odd, "wb") as f:
        f.write(b"x")
    status, d = await run(registry(root), "list_dir", path=str(root))
    assert status == "success"
    assert "caf\\xe9\\xff.txt" in [e["name"] for e in d["entries"]]      # as `ls -b` shows it
    status, d = await run(registry(root), "search_files", pattern="x", root=str(root))
    assert status == "success"


async def test_list_dir_pattern_limit_and_relative(root):
    status, d = await run(registry(root), "list_dir", path="sub", pattern="*.log")
    assert status == "success" and [e["name"] for e in d["entries"]] == ["worker.log"]
    status, d = await run(registry(root), "list_dir", path=".", limit=2)
    assert d["returned"] == 2 and d["matched"] == 4 and d["truncated"] is True
    status, d = await run(registry(root, max_list_entries=3), "list_dir", path=".", limit=4)
    assert status == "error" and d["error"] == "argument 'limit': expected an integer in 1..3, got 4"


async def test_list_dir_scan_cap(root):
    for i in range(30):
        (root / "sub" / f"f{i:02d}.txt").write_text("x")
    status, d = await run(registry(root, max_dir_scan=10), "list_dir", path="sub")
    assert status == "success" and d["truncated"] is True and d["scan_limit"] == 10 and d["matched"] <= 10


async def test_read_file_pages(root):
    status, d = await run(registry(root), "read_file", path="config.yaml")
    assert status == "success" and d["text"] == "port: 8080\nname: demo" and d["truncated"] is False
    status, d = await run(registry(root), "read_file", path="app.log", offset=2, lines=2)
    assert d["text"] == "ERROR disk full\nok" and d["truncated"] is True and d["next_offset"] == 4
    status, d = await run(registry(root), "read_file", path="app.log", offset=4)
    assert d["text"] == "error: retry" and d["truncated"] is False
    status, d = await run(registry(root), "read_file", path="app.log", offset=9)
    assert status == "error" and d["error"] == "'app.log' has 4 lines; offset 9 is past the end"


async def test_read_file_byte_cap_and_result_budget(root):
    (root / "big.txt").write_text("".join(f"{i:07d}\n" for i in range(100_000)))   # 800 kB
    status, d = await run(registry(root, max_file_bytes=8192), "read_file", path="big.txt", offset=2000, lines=10)
    assert status == "success" and d["text"] == "" and "max_file_bytes" in d["note"]
    status, d = await run(registry(root, max_result_chars=2048), "read_file", path="big.txt", lines=500)
    assert status == "success" and 0 < d["lines_returned"] < 500 and d["next_offset"] == d["lines_returned"] + 1
    assert d["text"].split("\n")[-1] == f"{d['lines_returned'] - 1:07d}"


async def test_read_file_refuses_binary_and_directories(root):
    status, d = await run(registry(root), "read_file", path="image.bin")
    assert status == "error" and d["error"] == "'image.bin' is a binary file (7 B); read_file shows text files only"
    (root / "latin1.txt").write_bytes(b"caf\xe9 au lait " * 10)
    status, d = await run(registry(root), "read_file", path="latin1.txt")
    assert status == "error" and "binary file" in d["error"]
    status, d = await run(registry(root), "read_file", path="sub")
    assert status == "error" and d["error"] == "'sub' is a directory; read_file reads regular text files only"
    status, d = await run(registry(root), "list_dir", path="app.log")
    assert status == "error" and d["error"] == "'app.log' is not a directory; use read_file to read a file"


@pytest.mark.parametrize("name", [".env", "server.pem", "id_rsa", "tls.key", "credentials", "shadow"])
async def test_secret_files_are_refused_by_name(root, name):
    tools = registry(root)
    status, d = await run(tools, "read_file", path=name)
    assert status == "error" and d["error"].startswith(f"'{name}' is refused: files named like")
    os.symlink(root / name, root / f"innocent-{name.strip('.')}.txt")     # a harmless name pointing at it
    status, d = await run(tools, "read_file", path=f"innocent-{name.strip('.')}.txt")
    assert status == "error" and "is refused" in d["error"]
    status, d = await run(tools, "search_files", root=".", pattern="secret")
    assert status == "success" and d["matches"] == []


async def test_search_files_literal_regex_and_case(root):
    tools = registry(root)
    status, d = await run(tools, "search_files", root=".", pattern="ERROR")
    assert status == "success"
    assert [(m["path"], m["line"], m["text"]) for m in d["matches"]] == [
        ("app.log", 2, "ERROR disk full"), ("sub/worker.log", 2, "ERROR worker")]
    assert d["skipped"]["binary"] == 1 and d["skipped"]["secret"] == 6
    status, d = await run(tools, "search_files", root="app.log", pattern="error", ignore_case=True)
    assert [m["line"] for m in d["matches"]] == [2, 4]
    status, d = await run(tools, "search_files", root=".", pattern=r"^error:\s+\w+$", regex=True)
    assert [(m["path"], m["line"]) for m in d["matches"]] == [("app.log", 4)]
    status, d = await run(tools, "search_files", root=".", pattern="p.rt")        # literal: '.' is a dot
    assert d["matches"] == []
    status, d = await run(tools, "search_files", root="image.bin", pattern="PNG")
    assert status == "error" and d["error"] == "'image.bin' is a binary file; search_files searches text files only"


async def test_search_files_bounds(root):
    big = root / "many.log"
    big.write_text("".join(f"ERROR {i}\n" for i in range(5000)))
    status, d = await run(registry(root), "search_files", root="many.log", pattern="ERROR", limit=7)
    assert d["returned"] == 7 and d["stopped"] == "limit" and d["matches"][-1]["line"] == 7
    status, d = await run(registry(root, max_search_bytes=4096), "search_files", root="many.log", pattern="4999")
    assert d["stopped"] == "max_search_bytes" and d["bytes_read"] == 4096 and d["matches"] == []
    for i in range(5):
        (root / "sub" / f"n{i}.txt").write_text("needle\n")
    status, d = await run(registry(root, max_search_files=2), "search_files", root="sub", pattern="needle")
    assert d["stopped"] == "max_search_files" and d["files_searched"] == 2
    (root / "long.log").write_text("x" * 5000 + "needle\n")
    status, d = await run(registry(root, max_line_chars=100), "search_files", root="long.log", pattern="needle")
    assert d["matches"][0]["text"] == "x" * 100 + "…"


async def test_search_files_time_bound(root, monkeypatch):
    from server.tools import search as search_mod

    class Clock:      # every reading is one second later: the deadline passes after a few files
        now = 0.0

        def monotonic(self):
            self.now += 1.0
            return self.now

    for i in range(20):
        (root / "sub" / f"d{i:02d}.txt").write_text("line\n" * 20)
    monkeypatch.setattr(search_mod, "time", Clock())
    status, d = await run(registry(root, search_timeout_s=3.0), "search_files", root="sub", pattern="zzz")
    assert status == "success" and d["truncated"] is True
    assert d["stopped"] == "search_timeout_s" and 0 < d["files_searched"] < 5


async def test_catastrophic_regex_is_linear(root):
    (root / "aaa.txt").write_text("a" * 200_000 + "!\n")
    start = time.monotonic()
    status, d = await run(registry(root), "search_files", root="aaa.txt", pattern="(a+)+$", regex=True)
    assert status == "success" and d["matches"] == [] and d["truncated"] is False
    assert time.monotonic() - start < 5      # a backtracking engine would never finish
    status, d = await run(registry(root), "search_files", root=".", pattern=r"(a)\1", regex=True)
    assert status == "error" and d["error"].startswith(r"invalid regular expression '(a)\\1': invalid escape")
    status, d = await run(registry(root), "search_files", root=".", pattern="(?<=a)b", regex=True)
    assert status == "error" and "invalid regular expression" in d["error"]


@pytest.mark.parametrize("tool,key", [("list_dir", "path"), ("read_file", "path"), ("search_files", "root")])
async def test_hostile_paths(root, tmp_path, tool, key):
    tools = registry(root)
    extra = {"pattern": "x"} if tool == "search_files" else {}
    cases = [
        ("../outside.txt", "path '../outside.txt' must not contain '..' components"),
        ("sub/../../outside.txt", "path 'sub/../../outside.txt' must not contain '..' components"),
        ("app\x00.log", "path must not contain NUL bytes"),
        (str(tmp_path / "outside.txt"), f"path '{tmp_path / 'outside.txt'}' is outside the allowed file directories"),
        ("/proc/self/environ", "path '/proc/self/environ' is under /proc, a pseudo filesystem that is never readable"),
        ("/dev/zero", "path '/dev/zero' is under /dev, a pseudo filesystem that is never readable"),
        ("/sys/kernel", "path '/sys/kernel' is under /sys, a pseudo filesystem that is never readable"),
        ("/" + "a" * 9999, "argument '" + key + "': expected at most 4096 characters, got 10000"),
        ("missing.txt", "no such file" + (" or directory" if tool != "read_file" else "") + ": 'missing.txt'"
         + (f" (looked for under {root})" if tool != "list_dir" else "")),
    ]
    for path, message in cases:
        status, d = await run(tools, tool, **{key: path}, **extra)
        assert status == "error" and d == {"error": message}, path
    os.symlink("/proc/self", root / "p")
    os.symlink(tmp_path, root / "up")
    status, d = await run(tools, tool, **{key: "p"}, **extra)
    assert status == "error" and d["error"] == "path 'p' resolves under /proc, a pseudo filesystem that is never readable"
    status, d = await run(tools, tool, **{key: "up/outside.txt"}, **extra)
    assert status == "error" and d["error"] == "path 'up/outside.txt' resolves outside the allowed file directories"
    status, d = await run(tools, "read_file", path="config.yaml")       # the registry goes on
    assert status == "success"


async def test_disabled_by_default(root):
    tools = ToolRegistry(ToolsConfig())
    for tool, args in (("list_dir", {"path": "/tmp"}), ("read_file", {"path": "/etc/hostname"}),
                       ("search_files", {"root": "/var/log", "pattern": "x"})):
        status, d = await run(tools, tool, **args)
        assert status == "error" and d["error"] == (
            f"{tool} is disabled: no file directories are configured on the server (tools.file_roots)")


async def test_hardlinks_are_refused(root, tmp_path):
    os.link(tmp_path / "outside.txt", root / "linked.txt")
    status, d = await run(registry(root), "read_file", path="linked.txt")
    assert status == "error" and d["error"] == (
        "'linked.txt' has 2 hard links and is refused: a hard link may expose a file from outside the allowed "
        "directories")
    status, d = await run(registry(root), "search_files", root=".", pattern="outside secret")
    assert d["matches"] == [] and d["skipped"]["hardlink"] == 1
    status, d = await run(registry(root), "search_files", root="linked.txt", pattern="outside")
    assert status == "error" and "2 hard links" in d["error"]


def test_config_rejects_pseudo_roots():
    from server.config_base import ConfigError
    for bad in (["/"], ["/proc"], ["/dev/shm"], ["relative"]):
        with pytest.raises(ConfigError) as ei:
            ToolsConfig.from_dict({"file_roots": bad})
        assert ei.value.path == "tools.file_roots"
    with pytest.raises(ConfigError) as ei:
        ToolsConfig.from_dict({"search_timeout_s": 20})
    assert ei.value.path == "tools.search_timeout_s"


async def test_schemas_offered(root):
    schemas = {s["function"]["name"]: s["function"] for s in registry(root, max_read_lines=40).schemas()}
    assert {"list_dir", "read_file", "search_files"} <= set(schemas)
    assert schemas["read_file"]["parameters"]["properties"]["lines"]["maximum"] == 40
    assert schemas["search_files"]["parameters"]["required"] == ["root", "pattern"]


async def test_lone_surrogates_are_refused(root):
    tools = registry(root)
    status, d = await run(tools, "read_file", path="app\ud800.log")
    assert status == "error" and d["error"] == "path must be valid Unicode text (it holds a lone surrogate)"
    status, d = await run(tools, "search_files", root=".", pattern="x\udfff")
    assert status == "error" and d["error"] == "pattern must be valid Unicode text (it holds a lone surrogate)"


NEW_SECRET_FILES = ["passwords", "passwords.txt", "site.htpasswd", "htpasswd", ".git-credentials", ".npmrc",
                    ".pypirc", ".my.cnf", "kubeconfig", "kubeconfig.yaml", "prod.kubeconfig", "putty.ppk",
                    ".vault-token", "secrets.yaml", ".docker/config.json", ".kube/config", "_netrc"]
NOT_SECRET_FILES = ["password_policy.md", "keyboard.txt", "config.json", "app/config", "secrets.py",
                    "token_budget.toml", "kube/config.yaml", "docker/config.json", "passwd"]


async def test_credential_files_are_refused_hidden_and_skipped(tmp_path):
    """Files that hold credentials by their name (htpasswd files, git / npm / PyPI / docker / kube
    credentials): refused by read_file, hidden by list_dir, skipped by search_files; files that only
    look alike are read as usual."""
    for name in NEW_SECRET_FILES + NOT_SECRET_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"FINDME in {name}\n")
    tools = registry(tmp_path)
    for name in NEW_SECRET_FILES:
        status, d = await run(tools, "read_file", path=name)
        assert status == "error" and "may hold secrets" in d["error"], name
        status, d = await run(tools, "read_file", path=str(tmp_path / name))
        assert status == "error" and "may hold secrets" in d["error"], name
    for name in NOT_SECRET_FILES:
        status, d = await run(tools, "read_file", path=name)
        assert status == "success" and d["text"] == f"FINDME in {name}", name
    status, d = await run(tools, "search_files", root=".", pattern="FINDME", limit=100)
    assert sorted(m["path"] for m in d["matches"]) == sorted(NOT_SECRET_FILES)
    for folder in (".docker", ".kube"):
        status, d = await run(tools, "list_dir", path=folder)
        assert status == "success" and d["entries"] == [] and d["hidden"] == 1, folder
    status, d = await run(tools, "list_dir", path=".")
    listed = {e["name"] for e in d["entries"]}
    assert not listed & {n for n in NEW_SECRET_FILES if "/" not in n}
    assert {n for n in NOT_SECRET_FILES if "/" not in n} <= listed

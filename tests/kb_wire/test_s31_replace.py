"""``nplt-client kb upload --replace`` replaces only the caller's own older documents named as the
uploaded file: not the documents of another name that a duplicate upload was already stored as,
and never another member's documents in a group."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))   # for client_testlib
from client_testlib import ServerThread  # noqa: E402

from client.main import main  # noqa: E402
from kb_wire.kbwire import auth_section, token  # noqa: E402

V1 = b"# Notes\n\nThe VPN endpoint is vpn-old.acme.io.\n"
V2 = b"# Notes\n\nThe VPN endpoint is vpn-new.acme.io.\n"


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "srv", sections={"auth": auth_section()}) as st:
        yield st


def run(st: ServerThread, capsys: pytest.CaptureFixture, user: str, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), "--token", token(user), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def upload(st: ServerThread, capsys: pytest.CaptureFixture, user: str, path: Path, data: bytes,
           *flags: str) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    code, out, err = run(st, capsys, user, "kb", "upload", str(path), "--json", *flags)
    assert code == 0, err
    [row] = json.loads(out)["files"]
    return row


def listed(st: ServerThread, capsys: pytest.CaptureFixture, user: str) -> dict[str, str]:
    code, out, err = run(st, capsys, user, "kb", "list", "--json")
    assert code == 0, err
    return {d["doc_id"]: d["name"] for d in json.loads(out)["documents"]}


def test_a_duplicate_stored_under_another_name_replaces_nothing_of_that_name(
        srv: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPLT_CLIENT_TOKEN", raising=False)
    v1 = upload(srv, capsys, "dave", tmp_path / "v1" / "notes.md", V1)
    v2 = upload(srv, capsys, "dave", tmp_path / "v2" / "notes.md", V2)        # both kept (no --replace)
    backup = tmp_path / "notes-backup.md"
    backup.write_bytes(V2)                                                   # a copy of v2 under another name
    code, out, err = run(srv, capsys, "dave", "kb", "upload", "--replace", str(backup))
    assert code == 0, err
    assert f'(duplicate: {backup} is already stored as "notes.md")' in out
    assert 'named "notes-backup.md" replaced; those named "notes.md" are kept' in out and "  replaced " not in out
    assert listed(srv, capsys, "dave") == {v1["doc_id"]: "notes.md", v2["doc_id"]: "notes.md"}   # v1 survives
    code, out, err = run(srv, capsys, "dave", "kb", "upload", "--replace", "--json", str(backup))
    [row] = json.loads(out)["files"]
    assert code == 0 and row["duplicate"] is True and row["name"] == "notes.md" and row["replaced"] == []
    assert set(listed(srv, capsys, "dave")) == {v1["doc_id"], v2["doc_id"]}
    # the file's own name is still replaced: an older notes-backup.md of dave's goes
    old = upload(srv, capsys, "dave", tmp_path / "old" / "notes-backup.md", b"# Notes\n\nstale backup\n")
    row = upload(srv, capsys, "dave", backup, V2, "--replace")
    assert row["duplicate"] is True and row["replaced"] == [old["doc_id"]]
    assert set(listed(srv, capsys, "dave")) == {v1["doc_id"], v2["doc_id"]}


def test_replace_in_a_group_never_touches_another_members_documents(
        srv: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPLT_CLIENT_TOKEN", raising=False)
    carol_v1 = upload(srv, capsys, "carol", tmp_path / "c1" / "notes.md", V1, "--group", "red")
    carol_v2 = upload(srv, capsys, "carol", tmp_path / "c2" / "notes.md", V2, "--group", "red")
    alice_own = upload(srv, capsys, "alice", tmp_path / "a0" / "notes.md", b"# Notes\n\nalice's draft\n",
                       "--group", "red")
    # alice uploads carol's v2 bytes as notes.md: a duplicate whose uploader is carol
    row = upload(srv, capsys, "alice", tmp_path / "a1" / "notes.md", V2, "--group", "red", "--replace")
    assert row["duplicate"] is True and row["doc_id"] == carol_v2["doc_id"]
    assert row["replaced"] == [alice_own["doc_id"]]                         # alice's own older one only
    assert set(listed(srv, capsys, "carol")) == {carol_v1["doc_id"], carol_v2["doc_id"]}

"""``nplt-client kb ...`` against a real server: upload (JSON per file, refusals non-zero with the
reason), list, search, download, delete."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))   # for client_testlib
from client_testlib import ServerThread  # noqa: E402

from client.main import main  # noqa: E402
from client.wording import stamp  # noqa: E402

NOTES = "# Ports\n\nThe metrics exporter listens on port 9100 by default.\n".encode()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tmp_path_factory.mktemp("kbcli")) as st:
        yield st


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_kb_commands(srv: ServerThread, capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch) -> None:
    notes, empty, exe = tmp_path / "notes.md", tmp_path / "empty.txt", tmp_path / "tool.exe"
    notes.write_bytes(NOTES)
    empty.write_bytes(b"")
    exe.write_bytes(b"MZ\x00\x01")
    code, out, err = run(srv, capsys, "kb", "upload", str(notes), "--json")
    assert code == 0, err
    [doc] = json.loads(out)["files"]
    assert set(doc) == {"path", "doc_id", "name", "md5", "chunks", "duplicate"} and doc["path"] == str(notes)
    assert doc["md5"] == hashlib.md5(NOTES).hexdigest() and doc["duplicate"] is False and doc["chunks"] == 1
    code, out, err = run(srv, capsys, "kb", "upload", str(notes), str(empty), str(exe), "--json")
    assert code == 5
    files = json.loads(out)["files"]
    assert files[0]["duplicate"] is True
    assert files[1]["error"]["code"] == files[2]["error"]["code"] == "UNSUPPORTED_MEDIA"
    assert "UNSUPPORTED_MEDIA" in err and "empty file" in err and "tool.exe" in err
    code, out, err = run(srv, capsys, "kb", "upload", str(tmp_path / "missing.md"))
    assert code != 0 and "missing.md" in err
    code, out, err = run(srv, capsys, "kb", "upload", str(notes), "--group", "ops")   # user local has no groups
    assert code == 5 and "FORBIDDEN" in err
    code, out, err = run(srv, capsys, "kb", "upload", str(notes), "--group", "personal")   # a group, never the own base
    assert code == 5 and "FORBIDDEN" in err                           # before: stored into user:local, exit 0
    code, out, _ = run(srv, capsys, "kb", "list", "--json")
    assert code == 0 and [d["doc_id"] for d in json.loads(out)["documents"]] == [doc["doc_id"]]
    [listed] = json.loads(out)["documents"]
    code, out, _ = run(srv, capsys, "kb", "list")                  # text: local time with its zone, "1 chunk"
    assert code == 0 and f"{doc['doc_id']}  {stamp(listed['uploaded_at'])}  " in out and " 1 chunk  " in out
    code, out, _ = run(srv, capsys, "kb", "search", "exporter port", "--limit", "3", "--json")
    hits = json.loads(out)["hits"]
    assert code == 0 and hits[0]["doc_id"] == doc["doc_id"] and "9100" in hits[0]["text"]
    assert {"doc_id", "name", "text", "score", "location"} <= set(hits[0])
    assert hits[0]["collection"] == listed["collection"]                # which base the passage is in
    code, out, _ = run(srv, capsys, "kb", "search", "exporter port", "--limit", "3")
    assert code == 0 and f"{hits[0]['citation']}  {listed['collection']}  ({hits[0]['chunk_id']})" in out
    target = tmp_path / "down" / "n.md"
    target.parent.mkdir()
    code, out, err = run(srv, capsys, "kb", "download", doc["doc_id"], "-o", str(target))
    assert code == 0, err
    assert target.read_bytes() == NOTES
    monkeypatch.chdir(target.parent)
    code, out, err = run(srv, capsys, "kb", "download", doc["doc_id"])
    assert code == 0 and (target.parent / "notes.md").read_bytes() == NOTES
    (target.parent / "notes.md").unlink()
    code, out, err = run(srv, capsys, "kb", "download", "notes.md")            # by name
    assert code == 0 and (target.parent / "notes.md").read_bytes() == NOTES and out.startswith("notes.md  ")
    other = tmp_path / "other" / "notes.md"
    other.parent.mkdir()
    other.write_bytes(NOTES + b"\nA second file of the same name.\n")
    code, out, err = run(srv, capsys, "kb", "upload", str(other), "--json")
    twin = json.loads(out)["files"][0]["doc_id"]
    code, out, err = run(srv, capsys, "kb", "download", "notes.md")            # two of that name
    assert code == 5 and "INVALID_MESSAGE" in err and doc["doc_id"] in err and twin in err
    code, out, err = run(srv, capsys, "kb", "download", "nothing.md")
    assert code == 5 and "NOT_FOUND" in err and "nothing.md" in err
    code, out, err = run(srv, capsys, "kb", "delete", twin)
    assert code == 0 and out == f"deleted {twin}\n"
    code, out, err = run(srv, capsys, "kb", "delete", "notes.md")              # by name: the one left
    assert code == 0 and out == f"deleted {doc['doc_id']}\n"
    code, out, err = run(srv, capsys, "kb", "delete", doc["doc_id"])
    assert code == 5 and "NOT_FOUND" in err
    code, out, _ = run(srv, capsys, "kb", "list", "--json")
    assert json.loads(out) == {"documents": []}


def test_upload_replace_deletes_the_older_versions_of_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path / "srv") as st:
        runbook = tmp_path / "runbook.md"
        runbook.write_text("# Restore\n\nThe restore timeout is 90 seconds.\n")
        code, out, _ = run(st, capsys, "kb", "upload", str(runbook), "--json")
        first = json.loads(out)["files"][0]["doc_id"]
        runbook.write_text("# Restore\n\nThe restore timeout is 120 seconds.\n")       # edited, uploaded again
        code, out, err = run(st, capsys, "kb", "upload", str(runbook), "--replace")
        assert code == 0, err
        second, replaced = out.split()[0], out.splitlines()[1].strip()
        assert replaced == f"replaced {first}" and second != first
        code, out, _ = run(st, capsys, "kb", "list", "--json")
        assert [d["doc_id"] for d in json.loads(out)["documents"]] == [second]
        code, out, _ = run(st, capsys, "kb", "search", "restore timeout", "--json")
        assert all("90 seconds" not in h["text"] for h in json.loads(out)["hits"])       # no stale passage
        other = tmp_path / "other.md"
        other.write_text("# Other\n\nnothing to replace\n")
        code, out, _ = run(st, capsys, "kb", "upload", str(other), "--replace", "--json")
        assert code == 0 and json.loads(out)["files"][0]["replaced"] == []


def test_names_typed_in_another_unicode_form_find_and_replace_the_document(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """A name in NFD (macOS) and the same name in NFC are one name, as on the server: download by
    either form finds the document, and --replace of an NFD-named file replaces the NFC-named upload."""
    nfc, nfd = "caf\u00e9 notes.md", "cafe\u0301 notes.md"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / nfc).write_text("# Cafe\n\nThe espresso machine is on port 8080.\n")
    (tmp_path / "b" / nfd).write_text("# Cafe\n\nThe espresso machine is on port 9090.\n")
    with ServerThread(tmp_path / "srv") as st:
        code, out, err = run(st, capsys, "kb", "upload", str(tmp_path / "a" / nfc), "--json")
        assert code == 0, err
        first = json.loads(out)["files"][0]["doc_id"]
        code, out, err = run(st, capsys, "kb", "download", nfd, "-o", str(tmp_path / "got.md"))
        assert code == 0, err
        assert "8080" in (tmp_path / "got.md").read_text()
        code, out, err = run(st, capsys, "kb", "upload", str(tmp_path / "b" / nfd), "--replace", "--json")
        assert code == 0, err
        [result] = json.loads(out)["files"]
        assert result["replaced"] == [first]
        code, out, _ = run(st, capsys, "kb", "list", "--json")
        assert [d["doc_id"] for d in json.loads(out)["documents"]] == [result["doc_id"]]


RUNBOOK = b"# Runbook\n\nRestart the worker, then check the queue depth is below 100.\n"


def test_download_never_replaces_a_file_nobody_named(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with ServerThread(tmp_path / "srv") as st:
        book = tmp_path / "runbook.md"
        book.write_bytes(RUNBOOK)
        code, out, err = run(st, capsys, "kb", "upload", str(book), "--json")
        assert code == 0, err
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        (work / "runbook.md").write_text("my local edits\n")
        code, out, err = run(st, capsys, "kb", "download", "runbook.md")        # ./runbook.md exists
        assert (code, out) == (2, "") and (work / "runbook.md").read_text() == "my local edits\n"
        assert err == ("nplt-client: FILE_EXISTS: runbook.md exists and is not replaced: name another file "
                       "with -o PATH, or replace it with --force\n")
        assert sorted(p.name for p in work.iterdir()) == ["runbook.md"]       # nothing was downloaded
        code, out, err = run(st, capsys, "kb", "download", "runbook.md", "--force")
        assert code == 0 and (work / "runbook.md").read_bytes() == RUNBOOK
        (work / "copy.md").write_text("old copy\n")
        code, out, err = run(st, capsys, "kb", "download", "runbook.md", "-o", "copy.md")   # named: replaced
        assert code == 0 and (work / "copy.md").read_bytes() == RUNBOOK
        code, out, err = run(st, capsys, "kb", "download", "runbook.md", "-o", str(work / "no" / "such" / "x.md"))
        assert code == 2 and err.startswith("nplt-client: WRITE_FAILED: cannot write ") and "Traceback" not in err
        # a FILE.part that is no download's (longer than the document, then shorter) is kept and named,
        # and --force starts the download over
        for stale in (b"z" * 100, b"z" * 10):
            (work / "rb3.md.part").write_bytes(stale)
            code, out, err = run(st, capsys, "kb", "download", "runbook.md", "-o", "rb3.md")
            assert code == 2 and "rb3.md.part exists and is not a download of this document" in err
            assert (work / "rb3.md.part").read_bytes() == stale and not (work / "rb3.md").exists()
            code, out, err = run(st, capsys, "kb", "download", "runbook.md", "-o", "rb3.md", "--force")
            assert code == 0, err
            assert (work / "rb3.md").read_bytes() == RUNBOOK and not (work / "rb3.md.part").exists()
            (work / "rb3.md").unlink()


def test_upload_results_name_their_path_and_a_duplicate_its_stored_name(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path / "srv") as st:
        book, twin, missing = tmp_path / "runbook.md", tmp_path / "中文手册.md", tmp_path / "missing.md"
        book.write_bytes(RUNBOOK)
        twin.write_bytes(RUNBOOK)                       # the same bytes under another name
        code, out, err = run(st, capsys, "kb", "upload", str(book), "--json")
        [first] = json.loads(out)["files"]
        code, out, err = run(st, capsys, "kb", "upload", str(twin), str(missing), "--json")
        assert code == 5
        dup, gone = json.loads(out)["files"]
        assert dup == {**first, "path": str(twin), "duplicate": True}          # stored as runbook.md
        assert gone["path"] == str(missing) and gone["error"]["code"] == "NOT_A_FILE"
        code, out, err = run(st, capsys, "kb", "upload", str(twin))
        assert code == 0 and out == (f"{first['doc_id']}  {first['md5']}  {'1 chunk':>12}  runbook.md  "
                                     f"(duplicate: {twin} is already stored as \"runbook.md\")\n")
        code, out, err = run(st, capsys, "kb", "upload", str(book))         # the same name: nothing to add
        assert code == 0 and out.endswith("  runbook.md  (duplicate: already stored)\n")

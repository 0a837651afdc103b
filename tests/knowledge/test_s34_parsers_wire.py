"""Stop 34, parsers over a real server with the CLI (``nplt-client kb upload``): tagged YAML, config
files, rotated logs, an owner-password-only pdf, Excel's ``sep=;`` csv and a one-line JSON are
stored and found; a csv with a quote never closed, a ``.env`` file and a JSON over its value limit
are refused with their reasons, and nothing of them is stored."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from kb_testlib import make_pdf
from server.knowledge import parsers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))   # for client_testlib
from client_testlib import ServerThread  # noqa: E402

from client.main import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated_client_config")   # (it runs the CLI in this process)


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def owner_only_pdf() -> bytes:
    from pypdf import PdfReader, PdfWriter
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(["The nightly backup runs on host bk-heron"]))))
    writer.encrypt(user_password="", owner_password="owner-secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


FILES = {
    "stack.yaml": b'Resources:\n  Bucket:\n    Properties:\n      BucketName: !Sub "${AWS::StackName}-walrus"\n',
    "nginx.conf": b"server {\n  listen 443 ssl;\n  server_name shop.example.com;  # nginx-marker-ibis\n}\n",
    "app.log.1": b"2026-11-01 10:00:00 INFO line from rotated log rotated-marker-yak\n",
    "owner.pdf": owner_only_pdf(),
    "excel.csv": b"sep=;\r\nhost;ip;role\r\nalpha;1.1.1.1;web-sepmarker\r\n",
    "services.json": json.dumps([{"name": "api", "owner": "team-kiwi", "zh": "\u4e2d\u6587"}]).encode(),
}
STRAY = "host,ip,note\n" + "".join(
    f'srv{i},10.2.0.{i},{chr(34) + "quoted start" if i == 3 else f"row note {i}"}\n' for i in range(1, 41))


def test_formats_over_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "stray.csv").write_text(STRAY)
    (tmp_path / ".env").write_text("API_KEY=sk-live-0123456789\n")
    monkeypatch.setattr(parsers, "JSON_MAX_VALUES", 1_000, raising=False)   # (the server runs in this process)
    (tmp_path / "dicts.json").write_text("[" + "{}," * 2_000 + "{}]")
    with ServerThread(tmp_path / "srv") as st:
        code, out, err = run(st, capsys, "kb", "upload", *(str(tmp_path / n) for n in FILES), "--json")
        assert code == 0, err
        files = json.loads(out)["files"]
        assert [f["name"] for f in files] == list(FILES) and all(f["chunks"] >= 1 for f in files)
        for query, name in [("walrus", "stack.yaml"), ("nginx-marker-ibis", "nginx.conf"),
                            ("rotated-marker-yak", "app.log.1"), ("bk-heron", "owner.pdf"),
                            ("web-sepmarker", "excel.csv"), ("team-kiwi", "services.json")]:
            code, out, err = run(st, capsys, "kb", "search", query, "--json")
            hits = json.loads(out)["hits"]
            assert code == 0 and hits and hits[0]["name"] == name, (query, hits)
        code, out, _ = run(st, capsys, "kb", "search", "sepmarker", "--json")
        assert "host: alpha; ip: 1.1.1.1; role: web-sepmarker" in json.loads(out)["hits"][0]["text"]
        code, out, _ = run(st, capsys, "kb", "search", "team-kiwi", "--json")
        assert '"zh": "\u4e2d\u6587"' in json.loads(out)["hits"][0]["text"]       # pretty-printed, decoded

        code, out, err = run(st, capsys, "kb", "upload", str(tmp_path / "stray.csv"), str(tmp_path / ".env"),
                             str(tmp_path / "dicts.json"), "--json")
        assert code == 5
        errors = [f["error"] for f in json.loads(out)["files"]]
        assert [e["code"] for e in errors] == ["UNSUPPORTED_MEDIA"] * 3
        assert "line 4" in errors[0]["message"] and "never closed" in errors[0]["message"]
        assert "environment file" in errors[1]["message"]
        assert "JSON_MAX_VALUES" in errors[2]["message"]
        code, out, _ = run(st, capsys, "kb", "list", "--json")
        assert sorted(d["name"] for d in json.loads(out)["documents"]) == sorted(FILES)

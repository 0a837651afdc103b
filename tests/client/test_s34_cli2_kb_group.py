"""``kb upload --group ""`` (review s34, fixer C2): an empty group name is a usage error (exit 2)
before connecting; before, the collection "group:" was sent and the server answered FORBIDDEN."""
from __future__ import annotations

from pathlib import Path

import pytest

from client.main import main
from client_testlib import ServerThread


async def _connections(srv: object) -> int:
    return len(srv.connections)      # type: ignore[attr-defined]


@pytest.mark.parametrize("group", ["", "  ", "group:", "group: "])
def test_an_empty_group_is_a_usage_error_before_connecting(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           group: str) -> None:
    doc = tmp_path / "notes.md"
    doc.write_text("# notes\nport 8080\n")
    with ServerThread(tmp_path / "server") as st:
        with pytest.raises(SystemExit) as stop:
            main(["--host", st.addr[0], "--port", str(st.addr[1]), "kb", "upload", "--group", group, str(doc)])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --group: expected a group's name, got {group!r}" in err
        assert "FORBIDDEN" not in err
        assert st.run(_connections(st.srv)) == 0
        # nothing was stored: the user's own listing is empty
        code = main(["--host", st.addr[0], "--port", str(st.addr[1]), "kb", "list", "--json"])
        assert code == 0
        assert '"documents": []' in capsys.readouterr().out

"""Another user's document (or a model's answer) never controls the reader's terminal through the
CLI: terminal controls in the server's text are printed in their visible ``\\uXXXX`` form
(``client.wording.printable``), in every output path, and ``--json`` stays valid JSON of the same text."""
from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from client import cli
from client.config import ClientConfig
from client.kb_cli import _bar
from client.main import build_parser
from client.wording import CONTROLS, printable
from client_testlib import V3_ONLY
from kb_wire.kbwire import auth_section, token
from server.app import Server
from testkit.server import make_config

SRC = Path(__file__).resolve().parents[2] / "src"

# set the window title, hide what follows, write the clipboard (OSC 52), and an 8-bit CSI (U+009B)
ATTACK = ("The backup rotation keeps seven copies. \x1b]0;PWNED-TITLE\x07\x1b[8mhidden text\x1b[0m "
          "\x1b]52;c;ZWNobyBwd25lZA==\x07 \x9b31mred\x9b0m done")
SHOWN = ("The backup rotation keeps seven copies. \\u001b]0;PWNED-TITLE\\u0007\\u001b[8mhidden text\\u001b[0m "
         "\\u001b]52;c;ZWNobyBwd25lZA==\\u0007 \\u009b31mred\\u009b0m done")
# What a document still carries to the client: the server drops ANSI CSI and OSC sequences at upload
# (docs/knowledge.md, Formats: a coloured log), so the document holds other escapes: a terminal reset
# (ESC c), a device control string (ESC P ... ESC \\), save/restore cursor (ESC 7 / ESC 8), BEL and an
# 8-bit CSI (U+009B), which the CLI must show, not run.
DOC_ATTACK = ("The backup rotation keeps seven copies. \x1bc\x1bP+q544e\x1b\\ \x1b7hidden text\x1b8\x07 "
              "\x9b31mred\x9b0m done")
DOC_SHOWN = printable(DOC_ATTACK)
# first (`kb search` prints a passage's first 300 characters), then long enough that its few control
# characters do not make the server take it for a binary file; the OSC title and clipboard writes of
# ATTACK are dropped at upload (never indexed, never shown)
DOCUMENT = DOC_ATTACK + " " + ATTACK[ATTACK.index("\x1b]0;"):ATTACK.index(" \x9b")] + "\n\n" + \
    "Rotation policy for the nightly backups of the billing database cluster. " * 20 + "\n"
QUESTION = "how many copies does the backup rotation keep according to the docs?"


@asynccontextmanager
async def wired_server(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    """The production wiring (the offline agent with the knowledge base) with users in groups;
    carol has uploaded the document into group red, which alice reads."""
    cfg = make_config(tmp_path, sections={"llm": {}, "auth": auth_section()}, **V3_ONLY)
    srv = Server(cfg)
    addr = await srv.start()
    try:
        path = tmp_path / "rotation.txt"
        path.write_text(DOCUMENT, encoding="utf-8")
        code, _, err = await run(addr, "carol", "kb", "upload", "--group", "red", str(path))
        assert code == 0, err
        yield addr
    finally:
        await srv.stop()


async def run(addr: tuple[str, int], user: str, *argv: str) -> tuple[int, str, str]:
    """One ``nplt-client`` command in-process, as ``main`` runs it: (exit code, stdout, stderr)."""
    args = build_parser().parse_args(["--host", addr[0], "--port", str(addr[1]), "--token", token(user), *argv])
    out, err = io.StringIO(), io.StringIO()
    code = await cli.run_command(args, ClientConfig.load(args), out, err)
    return code, out.getvalue(), err.getvalue()


def assert_safe(text: str) -> None:
    """No ESC, BEL, C1 or other control character but newline and tab."""
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if ord(ch) in CONTROLS})
    assert not bad, f"control characters printed raw: {bad}"


def test_printable_shows_every_control_but_newline_and_tab() -> None:
    assert printable(ATTACK) == SHOWN
    assert printable("a\tb\nc\rd\x00e\x7ff\x80g\x9fh\xa0i\u2028j 端口") == \
        "a\tb\nc\\u000dd\\u0000e\\u007ff\\u0080g\\u009fh\xa0i\u2028j 端口"


def test_the_progress_bar_keeps_its_carriage_return_and_shows_the_name() -> None:
    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> int:
            self.text += text
            return len(text)

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True
    term = Terminal()
    show = _bar(cli.PrintableWriter(term), "a\x1b[8mb.md")      # type: ignore[arg-type]
    assert show is not None
    show("indexing", 1, 1)
    assert term.text.startswith("\ra\\u001b[8mb.md") and "100%" in term.text and "\x1b" not in term.text


async def test_ask_kb_search_history_and_search_show_a_documents_escape_sequences(tmp_path: Path) -> None:
    async with wired_server(tmp_path) as addr:
        code, out, err = await run(addr, "alice", "ask", "--new", QUESTION)
        assert code == 0, err
        assert_safe(out)
        assert_safe(err)
        assert DOC_SHOWN in out                           # the offline agent quotes the passage, visibly
        assert "PWNED-TITLE" not in out and "ZWNob" not in out    # OSC sequences were dropped at upload
        code, out, err = await run(addr, "alice", "kb", "search", "backup rotation copies", "--limit", "3")
        assert code == 0, err
        assert_safe(out)
        assert printable("\x1bc\x1bP+q544e\x1b\\") in out
        code, out, err = await run(addr, "alice", "history")
        assert code == 0, err
        assert_safe(out)
        assert DOC_SHOWN in out
        code, out, err = await run(addr, "alice", "search", "q544e")
        assert code == 0, err
        assert_safe(out)
        assert "\\u001bP+q544e" in out


async def test_json_output_escapes_c1_controls_and_decodes_to_the_same_text(tmp_path: Path) -> None:
    """json.dumps escapes U+0000-U+001F but writes DEL and C1 (U+009B: CSI) raw: they are escaped too."""
    async with wired_server(tmp_path) as addr:
        code, out, err = await run(addr, "alice", "ask", "--new", QUESTION, "--json")
        assert code == 0, err
        assert_safe(out)
        assert "\\u009b31m" in out
        assert DOC_ATTACK in json.loads(out)["message"]["content"]   # the same text, decoded
        code, out, err = await run(addr, "alice", "kb", "search", "backup rotation copies", "--json")
        assert code == 0, err
        assert_safe(out)
        assert any(DOC_ATTACK in hit["text"] for hit in json.loads(out)["hits"])


async def test_the_real_process_writes_no_control_byte(tmp_path: Path) -> None:
    """``nplt-client ask`` as a process, stdout redirected (a later ``cat`` of it would run them)."""
    async with wired_server(tmp_path) as addr:
        env = {**os.environ, "PYTHONPATH": str(SRC), "NPLT_CLIENT_TOKEN": token("alice")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "client.main", "--host", addr[0], "--port", str(addr[1]), "ask", "--new", QUESTION,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err
        for raw in (b"\x1b", b"\x07", "\x9b".encode()):
            assert raw not in out and raw not in err
        assert DOC_SHOWN.encode() in out

"""Review s34 of the CLI, against real servers: a refused ``ask`` changes nothing (no model, prompt or
empty session left behind); ``ask -``/``prompt -`` read a bounded amount of stdin; ``history`` and
``search`` pass the server's ``truncated`` on; ``ask --json`` names a queued message by its stored
id; a blank system prompt is refused (CLI and server); a shutdown stop is marked as such; integer
arguments are bounded; the client library's log stays off the CLI's stderr; bidi controls are
shown, never run; the Markdown export names a group source's collection."""
from __future__ import annotations

import asyncio
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from client import cli
from client.config import ClientConfig
from client.connection import Client
from client.errors import ClientError
from client.main import build_parser, main
from client.wording import printable
from client_testlib import ServerThread
from testkit.server import wait_for
from protocol import ErrorCode

DEADLINE = 30.0
PIRATE = "Reply only in pirate speak."


@pytest.fixture
def st(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "server") as server:
        try:
            yield server
        finally:
            server.loop.call_soon_threadsafe(server.srv.agent.release)   # a "!block" turn a failed test left


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """main() in-process; (exit code, stdout, stderr)."""
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def new_session(st: ServerThread, capsys: pytest.CaptureFixture, text: str = "hello") -> str:
    code, out, err = run(st, capsys, "ask", "--new", text, "--json")
    assert code == 0, err
    return json.loads(out)["session_id"]


async def _client(st: ServerThread) -> Client:
    c = Client(*st.addr, reconnect=False)
    await c.connect()
    return c


def session_state(st: ServerThread, session_id: str) -> tuple[str | None, str | None, int]:
    """(model, own system prompt, message count) of a session, as the server has them."""
    async def go() -> tuple[str | None, str | None, int]:
        c = await _client(st)
        try:
            reply = await c.session_prompt(session_id=session_id)
            return reply.session.model, reply.system_prompt, reply.session.message_count
        finally:
            await c.close()
    return st.run(go())


def all_sessions(st: ServerThread, deleted: bool = False) -> list[str]:
    async def go() -> list[str]:
        c = await _client(st)
        try:
            return [s.session_id for s in (await c.session_list(limit=100, deleted=deleted)).sessions]
        finally:
            await c.close()
    return st.run(go())


def block_a_turn(st: ServerThread, session_id: str) -> threading.Thread:
    """``ask --session ID "!block"`` in a thread, returned once its turn is blocked in the agent."""
    def ask() -> None:
        args = build_parser().parse_args(["--host", st.addr[0], "--port", str(st.addr[1]),
                                          "ask", "--session", session_id, "!block held"])
        asyncio.run(cli.run_command(args, ClientConfig.load(args), io.StringIO(), io.StringIO()))
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    st.run(st.srv.agent.wait_blocked(1))
    return thread


def release(st: ServerThread, *threads: threading.Thread) -> None:
    st.loop.call_soon_threadsafe(st.srv.agent.release)
    for t in threads:
        t.join(DEADLINE)
        assert not t.is_alive()


def headers_of(history: str) -> list[str]:
    """The ``[id] role  time  (marks)`` lines of a text history."""
    return [line for line in history.splitlines() if re.match(r"\[\d+\] (user|assistant)  ", line)]




# -- 1. a refused ask changes nothing ---------------------------------------------------------------------
def test_a_too_long_ask_changes_neither_the_model_nor_the_prompt(st: ServerThread,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """Before: exit 5, but the session had switched to echo-large and got the pirate prompt."""
    sid = new_session(st, capsys)
    before = session_state(st, sid)
    too_long = "x" * 40_000                    # over the default max_text_chars (32000)
    code, out, err = run(st, capsys, "ask", "--session", sid, "--model", "echo-large", "--system", PIRATE, too_long)
    assert (code, out) == (cli.EXIT_REQUEST, "")
    assert err == "nplt-client: INVALID_MESSAGE: field 'text': expected at most 32000 characters, got 40000\n"
    assert session_state(st, sid) == before
    assert before[:2] == ("echo", None)      # (the server reports its default model)


def test_refused_ask_new_runs_leave_no_empty_session(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    """Before: each refused ``ask --new --system`` made (or kept) an empty session with the prompt."""
    sid = new_session(st, capsys)
    for _ in range(3):
        code, _, err = run(st, capsys, "ask", "--new", "--system", PIRATE, "--model", "echo-large", "y" * 40_000)
        assert code == cli.EXIT_REQUEST and "INVALID_MESSAGE" in err
    assert all_sessions(st) == [sid] and all_sessions(st, deleted=True) == []


def test_a_message_the_server_refuses_after_the_setup_is_undone(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """The server refuses the message itself (QUEUE_FULL: a turn runs, no queue) after --model and
    --system took effect: both are put back as they were."""
    with ServerThread(tmp_path / "server", max_queued_turns=0) as st:
        sid = new_session(st, capsys)
        code, _, err = run(st, capsys, "prompt", "--session", sid, "Be brief.")
        assert code == 0, err
        held = block_a_turn(st, sid)
        try:
            code, out, err = run(st, capsys, "ask", "--session", sid, "--model", "echo-large",
                                 "--system", PIRATE, "second")
            assert (code, out) == (cli.EXIT_REQUEST, "") and err.startswith("nplt-client: QUEUE_FULL: "), err
            # the model the session had none of its own of is switched back to the server's default
            assert session_state(st, sid)[:2] == ("echo", "Be brief.")
        finally:
            release(st, held)


def test_a_session_ask_new_made_for_a_refused_message_is_purged(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path / "server", max_active_turns_per_user=1) as st:
        sid = new_session(st, capsys)
        held = block_a_turn(st, sid)
        try:
            code, _, err = run(st, capsys, "ask", "--new", "--model", "echo-large", "--system", PIRATE, "hi")
            assert code == cli.EXIT_REQUEST and "max_active_turns_per_user" in err, err
            assert all_sessions(st) == [sid] and all_sessions(st, deleted=True) == []
        finally:
            release(st, held)


# -- 2. stdin is read up to a cap ---------------------------------------------------------------------------
class Flood(io.TextIOBase):
    """A stdin holding ``size`` characters, noting how many were read."""

    def __init__(self, size: int) -> None:
        self.left, self.taken = size, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> str:
        n = self.left if n is None or n < 0 else min(n, self.left)
        self.left -= n
        self.taken += n
        return "z" * n


def test_ask_dash_reads_at_most_its_cap_of_stdin(st: ServerThread, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the whole stdin was read first (300 MB: 624 MB of memory), then refused."""
    cap = 4 * 32_000                               # (cli.STDIN_READ_FACTOR x max_text_chars)
    flood = Flood(3_000_000)
    monkeypatch.setattr(sys, "stdin", flood)
    code, out, err = run(st, capsys, "ask", "-")
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err == (f"nplt-client: USAGE: stdin holds more than {cap} characters (4 x the server's "
                   "max_text_chars, 32000): nothing was sent\n")
    # (stdin is read before connecting, up to cli.STDIN_ASK_CHARS: all of these 3,000,000 characters;
    # test_s34_cli2_stdin.py checks that a longer flood is not read whole)
    assert flood.taken == 3_000_000
    # somewhat over the limit: the same refusal as the text given as an argument
    monkeypatch.setattr(sys, "stdin", io.StringIO("w" * 40_000 + "\n"))
    code, _, err = run(st, capsys, "ask", "-")
    assert code == cli.EXIT_REQUEST and "expected at most 32000 characters, got 40000" in err
    flood = Flood(1_000_000)
    monkeypatch.setattr(sys, "stdin", flood)
    code, _, err = run(st, capsys, "prompt", "-")
    assert code == cli.EXIT_USAGE and f"stdin holds more than {cli.STDIN_PROMPT_CHARS} characters" in err
    assert flood.taken == cli.STDIN_PROMPT_CHARS + 1


# -- 3. truncated pages say so -----------------------------------------------------------------------------
def test_history_and_search_pass_truncated_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A message over max_message_size comes cut in its page: --json said nothing of it, and the text
    had no mark."""
    with ServerThread(tmp_path / "server", max_message_size=65535) as st:
        sid = new_session(st, capsys)

        def big() -> None:
            st.srv.store.sync.append(sid, "assistant", "xxxx " * 30_000)
        st.run(asyncio.to_thread(big))
        code, out, err = run(st, capsys, "history", "--session", sid, "--json")
        assert code == 0, err
        page = json.loads(out)
        assert page["truncated"] is True
        assert "cut by the server to fit max_message_size" in page["messages"][-1]["content"]
        code, out, err = run(st, capsys, "history", "--session", sid)
        assert code == 0
        assert headers_of(out)[-1].endswith("(truncated)")
        assert "the server cut the longest texts of this page" in err
        cursor = page["next_before"]                    # the older messages came whole: no mark
        code, out, err = run(st, capsys, "history", "--session", sid, "--before", str(cursor))
        assert code == 0 and err == "" and headers_of(out) and "(truncated)" not in out
        code, out, err = run(st, capsys, "search", "xxxx", "--json")
        assert code == 0, err
        assert "truncated" not in json.loads(out)          # (as on the wire: only when cut)

        def many() -> None:                              # 200 hits do not fit in 64 KB
            for i in range(200):
                st.srv.store.sync.append(sid, "user", f"hit {i} " + "xxxx " * 60)
        st.run(asyncio.to_thread(many))
        assert run(st, capsys, "rename", sid, "t" * 200)[0] == 0     # (each hit carries the title)
        code, out, err = run(st, capsys, "search", "xxxx", "--limit", "200", "--json")
        assert code == 0, err
        found = json.loads(out)
        assert found["truncated"] is True and 0 < len(found["hits"]) < 200
        code, out, err = run(st, capsys, "search", "xxxx", "--limit", "200")
        assert code == 0 and err.startswith("nplt-client: only the best ")


def test_history_json_of_a_whole_page_has_no_truncated(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    sid = new_session(st, capsys)
    code, out, err = run(st, capsys, "history", "--session", sid, "--json")
    assert code == 0 and "truncated" not in json.loads(out) and err == ""


# -- 4. a queued message's id ------------------------------------------------------------------------------
def test_ask_json_names_a_queued_message_by_its_stored_id(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    """Before: ``user_message.id`` was null when the message waited behind another turn."""
    sid = new_session(st, capsys)
    held = block_a_turn(st, sid)
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []

    def ask() -> None:
        args = build_parser().parse_args(["--host", st.addr[0], "--port", str(st.addr[1]),
                                          "ask", "--session", sid, "--json", "queued one"])
        codes.append(asyncio.run(cli.run_command(args, ClientConfig.load(args), out, err)))
    queued = threading.Thread(target=ask, daemon=True)
    queued.start()
    runner = st.srv.services.runner
    wait_for(lambda: sid in runner.lanes and len(runner.lanes[sid].waiting) == 1, DEADLINE, "the queued turn")
    release(st, held, queued)
    assert codes == [0], err.getvalue()
    doc = json.loads(out.getvalue())
    stored = st.run(st.srv.store.page(sid, limit=10)).messages
    mine = [m for m in stored if m.role == "user" and m.content == "queued one"]
    assert doc["user_message"]["id"] == mine[0].id and isinstance(mine[0].id, int)
    assert doc["user_message"]["content"] == "queued one"


# -- 5. a blank system prompt ------------------------------------------------------------------------------
def test_a_blank_system_prompt_is_a_usage_error(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    sid = new_session(st, capsys)
    code, out, err = run(st, capsys, "prompt", "--session", sid, "   ")
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err == "nplt-client: USAGE: the system prompt is blank: give its text, or --clear to reset it to the server's\n"
    code, out, err = run(st, capsys, "ask", "--session", sid, "--system", "  ", "hi")
    assert (code, out) == (cli.EXIT_USAGE, "") and "--system is blank" in err
    assert session_state(st, sid)[1] is None
    code, _, err = run(st, capsys, "ask", "--session", sid, "--system", "", "hi")      # "" resets: allowed
    assert code == 0, err


def test_the_server_refuses_a_blank_system_prompt(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    """Before: "   " was stored and replaced the server's system prompt."""
    sid = new_session(st, capsys)

    async def go() -> None:
        c = await _client(st)
        try:
            with pytest.raises(ClientError) as info:
                await c.session_prompt("  \n ", session_id=sid)
            assert info.value.code == ErrorCode.INVALID_MESSAGE and "only whitespace" in info.value.message
            assert (await c.session_prompt(session_id=sid)).system_prompt is None
            with pytest.raises(ClientError) as info:
                await c.session_new(system_prompt="   ")
            assert info.value.code == ErrorCode.INVALID_MESSAGE
            assert (await c.session_prompt("Be brief.", session_id=sid)).system_prompt == "Be brief."
            assert (await c.session_prompt("", session_id=sid)).system_prompt is None     # the reset
        finally:
            await c.close()
    st.run(go())
    assert all_sessions(st) == [sid]


# -- 6. a shutdown stop is not "cancelled" ----------------------------------------------------------------
def test_history_marks_a_shutdown_stop_as_such(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    sid = new_session(st, capsys)

    def stopped() -> None:
        st.srv.store.sync.append(sid, "assistant", "half an answer", metadata={
            "finish_reason": "cancelled", "cancel_reason": "shutdown", "partial": True})
    st.run(asyncio.to_thread(stopped))
    code, out, err = run(st, capsys, "history", "--session", sid)
    assert code == 0, err
    header = headers_of(out)[-1]
    assert header.endswith("(stopped: the server shut down, partial)")
    assert cli.message_marks({"finish_reason": "cancelled", "partial": True}) == ["cancelled", "partial"]


# -- 8. integer arguments within the protocol's range -------------------------------------------------------
def test_history_cursor_and_limit_bounds_are_usage_errors(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    """Before: exit 5, "cannot be encoded: Integer exceeds 64-bit range", and --limit 100000 exit 5."""
    sid = new_session(st, capsys)
    huge = "99999999999999999999999"
    with pytest.raises(SystemExit) as info:
        main(["--host", st.addr[0], "--port", "1", "history", "--before", huge])   # (port 1: never connected)
    assert info.value.code == cli.EXIT_USAGE
    assert "expected a positive integer of at most 9223372036854775807" in capsys.readouterr().err
    code, out, err = run(st, capsys, "history", "--session", sid, "--before", str(cli.MAX_INTEGER_ARGUMENT))
    assert code == 0, err
    code, out, err = run(st, capsys, "history", "--session", sid, "--limit", "100000")
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err == "nplt-client: USAGE: --limit 100000 is over the server's max_page_size (200)\n"
    code, out, err = run(st, capsys, "search", "hello", "--limit", "100000")
    assert code == cli.EXIT_USAGE and "max_page_size (200)" in err
    assert run(st, capsys, "history", "--session", sid, "--limit", "200")[0] == 0


def test_sessions_pages_within_a_small_max_page_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with ServerThread(tmp_path / "server", max_page_size=2) as st:
        made = {new_session(st, capsys, f"s{i}") for i in range(3)}
        code, out, err = run(st, capsys, "sessions", "--json")
        assert code == 0, err
        assert {s["session_id"] for s in json.loads(out)["sessions"]} == made


# -- 7. the client library's log stays off the CLI's stderr ------------------------------------------------
class FreezingProxy:
    """A TCP proxy to the server that stops passing the server's bytes on once the client has sent
    its second chunk (the HELLO, then a request): a server gone silent without closing."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.socks: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            down, _ = self.listener.accept()
        except OSError:
            return
        up = socket.create_connection(self.target)
        self.socks += [down, up]
        threading.Thread(target=self._pipe, args=(down, up, True), daemon=True).start()
        threading.Thread(target=self._pipe, args=(up, down, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        chunks = 0
        try:
            while data := src.recv(65536):
                if from_client:
                    chunks += 1
                    if chunks >= 2:
                        self.frozen.set()
                elif self.frozen.is_set():
                    continue                      # swallowed: the server seems frozen
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for s in self.socks:
            s.close()


def test_a_liveness_timeout_prints_only_the_cli_error_line(st: ServerThread, tmp_path: Path) -> None:
    """Before: "no byte from 127.0.0.1:PORT for 1.0 s, nor an answer to PING: ..." came first, bare,
    through Python's last-resort handler."""
    proxy = FreezingProxy(st.addr)
    try:
        env = {**os.environ, "NPLT_CLIENT_HOST": "127.0.0.1", "NPLT_CLIENT_PORT": str(proxy.port),
               "NPLT_CLIENT_LIVENESS_TIMEOUT_S": "0.5", "HOME": str(tmp_path / "home"),
               "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.run([sys.executable, "-m", "client.main", "sessions"], env=env, capture_output=True,
                              timeout=DEADLINE)
    finally:
        proxy.close()
    assert proxy.frozen.is_set()
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == cli.EXIT_CONNECTION, lines
    assert len(lines) == 1 and lines[0].startswith(
        "nplt-client: CONNECTION_LOST: connection lost: no answer from the server"), lines


# -- 9. bidi controls are shown, never run ------------------------------------------------------------------
BIDI = "ok \u202eexe.txt\u202c and \u2067isolated\u2069 \u200fmark"


def test_bidi_controls_are_escaped_in_ask_history_and_export(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(st, capsys, "ask", "--new", BIDI)
    assert code == 0, err
    shown = "ok \\u202eexe.txt\\u202c and \\u2067isolated\\u2069 \u200fmark"   # (RLM: a mark, kept)
    assert out == f"echo: {shown}\n"
    code, out, _ = run(st, capsys, "history")
    assert shown in out and "\u202e" not in out
    code, out, _ = run(st, capsys, "export")
    assert shown in out and not set(out) & {chr(c) for c in range(0x202A, 0x202F)}
    code, out, _ = run(st, capsys, "history", "--json")
    assert "\u202e" not in out and json.loads(out)["messages"][0]["content"] == BIDI   # JSON decodes to the text
    assert printable("\u2066\u2068\u202a\u202b\u202d") == "\\u2066\\u2068\\u202a\\u202b\\u202d"


# -- 10. group sources are named in the export ------------------------------------------------------------
CITES = [{"citation": "[ops-runbook.md §Ops runbook > Backup, line 5]", "doc_id": "a1", "name": "ops-runbook.md",
          "chunk_id": "a1:0", "collection": "group:ops"},
         {"citation": "[ops-runbook.md §Ops runbook > Backup, line 5]", "doc_id": "b2", "name": "ops-runbook.md",
          "chunk_id": "b2:0", "collection": "personal"}]


def test_the_markdown_export_names_a_group_sources_collection(st: ServerThread, capsys: pytest.CaptureFixture) -> None:
    """Before: "Sources: [ops-runbook.md §…] [ops-runbook.md §…]": the group's and the personal
    document looked the same."""
    sid = new_session(st, capsys)

    def answer() -> None:
        st.srv.store.sync.append(sid, "assistant", "From your documents: ...", metadata={"citations": CITES})
    st.run(asyncio.to_thread(answer))
    code, out, err = run(st, capsys, "export", "--session", sid)
    assert code == 0, err
    sources = [line for line in out.splitlines() if line.startswith("Sources:")]
    assert sources == ["Sources: [ops-runbook.md §Ops runbook > Backup, line 5] (group ops) "
                       "[ops-runbook.md §Ops runbook > Backup, line 5]"]

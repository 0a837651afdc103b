"""``ask -`` reads its message from stdin before it connects (review s34, fixer C2): a slow producer
(``(sleep 12; echo 现在几点) | nplt-client ask -``) holds no connection meanwhile, and a server
restarted while it is still writing gets the message; the read stays bounded (``cli.STDIN_ASK_CHARS``)
and the server's own limits are applied once connected."""
from __future__ import annotations

import contextlib

import io
import json
import socket
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from client import cli
from client.main import main
from client_testlib import ServerThread

DEADLINE = 30.0


class SlowProducer(io.TextIOBase):
    """A piped stdin whose writer is slow: the first read runs ``meanwhile`` (what happens while the
    producer is still writing) before the text comes; later reads find the end of the pipe."""

    def __init__(self, text: str, meanwhile: Callable[[], None]) -> None:
        self.text, self.meanwhile, self.reads = text, meanwhile, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> str:
        self.reads += 1
        if self.reads > 1:
            return ""
        self.meanwhile()
        return self.text if n is None or n < 0 else self.text[:n]


async def _connections(srv: Any) -> int:
    return len(srv.connections)


def test_slow_piped_message_survives_a_server_restart(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``ask -`` connected first and then waited for stdin, holding a connection (a
    ``max_clients`` slot) all along; a server restarted meanwhile dropped it and the message was lost:
    exit 3, ``NOT_CONNECTED: not connected (disconnected)``."""
    seen: dict[str, int] = {}
    with contextlib.ExitStack() as running:          # every server started is stopped once, whatever fails
        first = ServerThread(tmp_path / "server")
        first_stop = contextlib.ExitStack()
        first_stop.enter_context(first)
        running.push(first_stop.__exit__)
        host, port = first.addr
        servers = [first]

        def restart() -> None:          # the producer is still writing: the server restarts (same port)
            seen["connections"] = first.run(_connections(first.srv))
            first_stop.close()
            servers.append(running.enter_context(ServerThread(tmp_path / "server", port=port)))

        stdin = SlowProducer("现在几点\n", restart)
        monkeypatch.setattr(sys, "stdin", stdin)
        code = main(["--host", host, "--port", str(port), "ask", "-", "--json"])
        out = capsys.readouterr()
    assert len(servers) == 2                       # (the restart happened while stdin was read)
    assert code == cli.EXIT_OK, out.err
    assert seen["connections"] == 0                # no connection held while the producer writes
    answer = json.loads(out.out)
    assert answer["user_message"]["content"] == "现在几点"
    assert answer["message"]["content"] == "echo: 现在几点"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_stdin_is_read_bounded_and_refused_before_connecting(capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A stdin over ``STDIN_ASK_CHARS`` and an empty one are usage errors (exit 2) before any
    connection is tried (nothing listens on the port: a connection attempt would exit 3), and the
    flood is read only up to the cap."""
    port = _free_port()
    monkeypatch.setattr(cli, "STDIN_ASK_CHARS", 5_000)     # (10,000,000 by default)
    flood = Flood(1_000_000)
    monkeypatch.setattr(sys, "stdin", flood)
    code = main(["--host", "127.0.0.1", "--port", str(port), "ask", "-"])
    out = capsys.readouterr()
    assert (code, out.out) == (cli.EXIT_USAGE, "")
    assert out.err == ("nplt-client: USAGE: stdin holds more than 5000 characters (the most any server's "
                       "max_text_chars can be): nothing was sent\n")
    assert flood.taken == 5_001
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n\n"))
    code = main(["--host", "127.0.0.1", "--port", str(port), "ask", "-"])
    assert (code, capsys.readouterr().err) == (cli.EXIT_USAGE, f"nplt-client: USAGE: {cli.EMPTY_MESSAGE}\n")


def test_the_servers_limits_still_apply_once_connected(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Read first, checked once connected: past 4 x the server's max_text_chars a usage error, past
    1 x INVALID_MESSAGE (exit 5), as the same text given as an argument; nothing is stored."""
    with ServerThread(tmp_path / "server", max_text_chars=100) as st:
        args = ["--host", st.addr[0], "--port", str(st.addr[1]), "ask", "-"]
        monkeypatch.setattr(sys, "stdin", io.StringIO("y" * 401))
        code = main(args)
        assert (code, capsys.readouterr().err) == (
            cli.EXIT_USAGE, "nplt-client: USAGE: stdin holds more than 400 characters (4 x the server's "
                            "max_text_chars, 100): nothing was sent\n")
        monkeypatch.setattr(sys, "stdin", io.StringIO("y" * 400 + "\n"))
        code = main(args)
        assert code == cli.EXIT_REQUEST
        assert "expected at most 100 characters, got 400" in capsys.readouterr().err
        monkeypatch.setattr(sys, "stdin", io.StringIO("y" * 100 + "\n"))
        code = main([*args, "--json"])
        out = capsys.readouterr()
        assert code == cli.EXIT_OK, out.err
        assert json.loads(out.out)["message"]["content"] == "echo: " + "y" * 100


def test_a_closed_stdin_is_refused_before_connecting(capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    closed = io.StringIO("text")
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)
    code = main(["--host", "127.0.0.1", "--port", str(_free_port()), "ask", "-"])
    assert code == cli.EXIT_USAGE and "stdin is closed" in capsys.readouterr().err

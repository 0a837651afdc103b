"""``nplt-client`` against a server on the other side of a TLS mismatch: the error says which end
speaks TLS (exit code 3), and an error without text names its class."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from client import cli
from client.main import main
from client_testlib import ServerThread

CERT, KEY = (str(Path(__file__).parent / "certs" / name) for name in ("cert.pem", "key.pem"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, ServerThread]]:
    with ServerThread(tmp_path_factory.mktemp("plain")) as plain, \
            ServerThread(tmp_path_factory.mktemp("tls"), tls_cert=CERT, tls_key=KEY) as tls:
        yield plain, tls


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tls_to_a_plain_port_says_to_drop_tls(servers, capsys: pytest.CaptureFixture) -> None:
    plain, _ = servers
    code, out, err = run(plain, capsys, "--tls", "--tls-ca", CERT, "sessions")
    assert (code, out) == (cli.EXIT_CONNECTION, "")
    assert err.startswith(f"nplt-client: TLS_ERROR: {plain.addr[0]}:{plain.addr[1]} closed the connection during "
                          "the TLS handshake (")
    assert err.endswith("): the server does not speak TLS on this port (drop --tls), or it refused the connection "
                        "before the handshake (full, or too many connections from this address: try again later)\n")


def test_plain_to_a_tls_port_says_to_use_tls(servers, capsys: pytest.CaptureFixture) -> None:
    _, tls = servers
    code, out, err = run(tls, capsys, "sessions")
    assert (code, out) == (cli.EXIT_CONNECTION, "")
    assert err == (f"nplt-client: TLS_ERROR: {tls.addr[0]}:{tls.addr[1]} closed the connection without answering "
                   "HELLO: the server expects TLS (use --tls), or it is out of resources (its log may say 'Too many open "
                   "files'), or it is not an NPLT server\n")
    code, out, err = run(tls, capsys, "--tls", "sessions")                  # no CA: not trusted, says how
    assert code == cli.EXIT_CONNECTION and "is not trusted: self-signed certificate" in err and "--tls-ca" in err
    code, out, err = run(tls, capsys, "--tls", "--tls-ca", CERT, "sessions", "--json")
    assert code == 0 and out.startswith("{")

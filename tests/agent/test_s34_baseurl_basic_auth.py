"""The base_url's password never reaches users base64-encoded (review s34, fixer C2).

The HTTP client sends a base_url's user info as ``Authorization: Basic base64(user:password)``. An
endpoint that echoes the request's headers in its error (``fakellm.py``'s echo401 model: a 401 naming
``auth=Basic c3ZjOlN1cDNyUzNjcmV0UHcwcmQ=``) put the password, base64-encoded, into TURN_ERROR, the
stored ``metadata.error_message`` and the CLI's stderr. ``llm_support.url_basic_credentials`` (every
form of it) is scrubbed from the endpoint's error texts, which also go through ``redact_shapes``."""
from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx2
import openai
import orjson
import pytest

from client import cli
from client.main import main
from protocol import MsgType
from server.agent import llm_support
from server.agent.llm_support import to_agent_error, url_basic_credentials
from testkit.process import ServerProcess
from testkit.scripted_llm import Recorded, ScriptedLLM
from testkit.server import V3Client

pytestmark = pytest.mark.usefixtures("isolated_client_config")   # (it runs the CLI in this process)

USER, PASSWORD = "svc", "Sup3rS3cretPw0rd"


def encodings(user: str, password: str) -> set[str]:
    """Every way a Basic header may carry ``user:password``: standard and URL-safe base64, with and
    without padding."""
    raw = f"{user}:{password}".encode()
    return {form for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode())
            for form in (encoded, encoded.rstrip("="))}


BASIC = encodings(USER, PASSWORD)
SECRETS = (PASSWORD, *BASIC)


class EchoingLLM(ScriptedLLM):
    """An endpoint that answers every completion with a 401 echoing the request line and its
    Authorization header (as fakellm.py's echo401 model)."""

    async def _respond(self, req: Recorded, writer: asyncio.StreamWriter) -> bool:
        await self._send_json(writer, 401, {"error": {
            "message": f"bad credentials for request {req.method} {req.path} host={req.headers.get('host')} "
                       f"auth={req.headers.get('authorization')}",
            "type": "invalid_request_error"}})
        return True


def test_url_basic_credentials() -> None:
    # a password with characters the URL percent-encodes, and one whose base64 holds '+' and '/'
    # (URL-safe: '-' and '_'), and one whose length leaves '=' padding
    for user, password in ((USER, PASSWORD), ("ops", "p@ss>>>?w0rd"), ("a", "~~~~~~~~")):
        quoted = password.replace("@", "%40").replace("?", "%3F")
        forms = set(url_basic_credentials(f"http://{user}:{quoted}@127.0.0.1:1/v1"))
        assert encodings(user, password) <= forms, (user, password)
    assert set(url_basic_credentials("https://KEY0123456789abcdef@h")) == encodings("KEY0123456789abcdef", "")
    assert url_basic_credentials("https://ops@h/v1") == ()            # a user name alone that is no key
    assert url_basic_credentials("http://u:pw@h/v1") == ()            # too short to be a secret (url_secrets)
    assert url_basic_credentials("https://api.openai.com/v1") == url_basic_credentials(None) == ()


@pytest.mark.parametrize("encoded", sorted(BASIC))
def test_an_echoed_basic_header_is_scrubbed_from_the_error(encoded: str) -> None:
    base_url = f"http://{USER}:{PASSWORD}@127.0.0.1:44027/v1"
    request = httpx2.Request("POST", "http://127.0.0.1:44027/v1/chat/completions")
    body = {"error": {"message": f"bad credentials auth=Basic {encoded} (token {encoded})"}}
    exc = openai.APIStatusError("x", response=httpx2.Response(401, request=request), body=body)
    message = str(to_agent_error(exc, base_url, 5.0, None))
    assert message.startswith("the model endpoint 127.0.0.1:44027 returned HTTP 401"), message
    assert not [s for s in SECRETS if s in message], message


def test_a_basic_credential_of_another_url_is_masked_by_its_shape() -> None:
    """redact_shapes: a ``Basic`` credential the endpoint echoes that is not the base_url's own (a
    proxy's) is masked too."""
    other = base64.b64encode(b"proxyuser:Pr0xyPassw0rd!").decode()
    request = httpx2.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    exc = openai.APIStatusError("x", response=httpx2.Response(401, request=request),
                                body={"error": {"message": f"proxy said Authorization: Basic {other}"}})
    message = str(llm_support.to_agent_error(exc, "http://127.0.0.1:1/v1", 5.0, None))
    assert other not in message and "returned HTTP 401" in message, message


async def test_a_real_server_and_the_cli_never_show_the_encoded_password(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """The repro: a real server process whose base_url carries a password; the endpoint's 401 echoes the
    Basic header. Neither the TURN_ERROR, the stored message (history, export), the CLI's stderr nor the
    log holds the password in any form."""
    data = tmp_path / "data"
    async with EchoingLLM() as llm:
        url = f"http://{USER}:{PASSWORD}@127.0.0.1:{llm.port}/v1"
        srv = await ServerProcess.start(data, "--log-level", "debug",
                                        env={"NPLT_LLM_BASE_URL": url, "NPLT_LLM_MODEL": "scripted-model"})
        try:
            c = await V3Client.connect(srv.addr)
            r = await c.call(MsgType.CHAT_TEXT, text="hi")
            events = await c.turn_events(r["turn_id"], timeout=30)
            blob = orjson.dumps([ev.body for ev in events]).decode()
            blob += orjson.dumps(await c.call(MsgType.HISTORY_REQUEST)).decode()
            blob += (await c.call(MsgType.HISTORY_EXPORT, format="json"))["content"]
            await c.close()
            code = await asyncio.to_thread(main, ["--host", srv.addr[0], "--port", str(srv.addr[1]),
                                                  "ask", "--new", "hello"])
            err = capsys.readouterr().err
        finally:
            assert await srv.stop() == 0
    sent = {r.headers.get("authorization") for r in llm.requests}
    assert sent == {f"Basic {base64.b64encode(f'{USER}:{PASSWORD}'.encode()).decode()}"}   # (what was echoed)
    [error] = [ev.body for ev in events if ev.type == MsgType.TURN_ERROR]
    assert error["message"].startswith(f"the model endpoint 127.0.0.1:{llm.port} returned HTTP 401"), error
    assert "bad credentials for request POST /v1/chat/completions" in error["message"]
    assert code == cli.EXIT_TURN and "returned HTTP 401" in err, (code, err)
    for text in (blob, err, srv.log_path.read_text()):
        assert not [s for s in SECRETS if s in text], text

"""A base_url with a query string or a fragment is refused at start-up (review s34, fixer C2).

``NPLT_LLM_BASE_URL=http://host/v1?api-key=K&api-version=2024-02-01`` never worked: the client appends
``chat/completions`` to base_url as a string, so the request went to
``POST /v1/?api-key=K&api-version=2024-02-01chat/completions``; the server started anyway and every
turn failed. Now it is a configuration error (exit 2) naming the setting and the endpoint's host only,
never the password or the key the URL holds."""
from __future__ import annotations

from pathlib import Path

import pytest

from server.agent.config import LLMConfig
from server.config_base import ConfigError
from testkit.process import ServerProcess

PASSWORD, QUERY_KEY = "Sup3rS3cretPw0rd", "QueryKeyABCDEF123456"
SECRETS = (PASSWORD, QUERY_KEY, "svc:")


@pytest.mark.parametrize("url,part", [
    (f"http://svc:{PASSWORD}@127.0.0.1:44027/v1?api-key={QUERY_KEY}&api-version=2024-02-01", "a query string"),
    ("https://llm.example.com/v1?", "a query string"),
    ("https://llm.example.com/v1#section", "a fragment"),
    (f"http://svc:pa?{PASSWORD}@llm.example.com/v1", "a query string"),    # an unencoded '?' in a password
])
def test_a_base_url_with_a_query_or_fragment_is_a_config_error(url: str, part: str) -> None:
    for source in ({"base_url": url}, {}):
        env = {} if source else {"NPLT_LLM_BASE_URL": url}
        with pytest.raises(ConfigError) as refused:
            LLMConfig.from_dict({**source, "model": "m"}, env=env)
        message = str(refused.value)
        assert message.startswith("llm.base_url: the URL of ") and f"has {part}" in message, message
        assert "api_key or NPLT_LLM_API_KEY" in message
        assert not [s for s in SECRETS if s in message], message


def test_a_plain_base_url_is_still_taken() -> None:
    cfg = LLMConfig.from_dict({"base_url": f"http://svc:{PASSWORD}@127.0.0.1:44027/v1/", "model": "m"}, env={})
    assert cfg.base_url == f"http://svc:{PASSWORD}@127.0.0.1:44027/v1"
    assert LLMConfig.from_dict({}, env={"NPLT_LLM_BASE_URL": "https://llm.example.com/openai/v1"}).usable


async def test_the_server_refuses_to_start(tmp_path: Path) -> None:
    """Before: the server started (and every turn failed with an HTTP 404 from the mangled path)."""
    url = f"http://svc:{PASSWORD}@127.0.0.1:9/v1?api-key={QUERY_KEY}&api-version=2024-02-01"
    try:
        srv = await ServerProcess.start(tmp_path / "data", env={"NPLT_LLM_BASE_URL": url, "NPLT_LLM_MODEL": "m"})
    except AssertionError as exc:
        refusal = str(exc)
    else:
        await srv.stop()
        pytest.fail("the server started with a base_url holding a query string")
    assert refusal.startswith("server exited with 2:"), refusal
    assert "configuration error: llm.base_url: the URL of 127.0.0.1:9 has a query string" in refusal
    assert not [s for s in SECRETS if s in refusal], refusal


def test_a_url_of_another_scheme_is_refused_without_showing_its_password():
    with pytest.raises(ConfigError) as refused:
        LLMConfig.from_dict({"base_url": "ftp://svc:FtpPa55word@files.internal/v1", "model": "m"}, env={})
    message = str(refused.value)
    assert "a ftp:// URL for files.internal" in message and "FtpPa55word" not in message, message

"""Review s32: a configuration error about a secret key (``[llm] api_key``, a token, a password) says
what kind of value it got, never the value; other keys still show theirs."""
from __future__ import annotations

import pytest
from pydantic import Field, field_validator

from protocol import settings
from protocol.settings import Invalid, Settings
from server.cli import load_config
from server.config import ServerConfig
from server.config_base import ConfigError

KEY = "sk-REAL-SECRET-KEY-123"


@pytest.mark.parametrize("toml, shown", [
    (f'api_key = ["{KEY}"]', "<a list, redacted>"),
    ("api_key = 12345678901", "<an integer, redacted>"),
    (f'api_key = {{ value = "{KEY}" }}', "<a table, redacted>"),
])
def test_llm_api_key_of_the_wrong_type_is_not_echoed(tmp_path, toml, shown):
    path = tmp_path / "nplt.toml"
    path.write_text(f"[llm]\n{toml}\n")
    with pytest.raises(ConfigError) as ei:
        load_config(["--config", str(path)], env={})
    text = str(ei.value)
    assert text == f"llm.api_key: expected a string, got {shown}"
    assert KEY not in text and "12345678901" not in text


def test_token_digest_given_a_raw_token_in_a_list_is_not_echoed():
    with pytest.raises(ConfigError) as ei:
        ServerConfig.from_dict({"auth": {"users": [{"user_id": "a", "token_sha256": ["my-raw-token"]}]}}, env={})
    assert "my-raw-token" not in str(ei.value) and "redacted" in str(ei.value)


def test_other_keys_still_show_what_they_got():
    with pytest.raises(ConfigError) as ei:
        ServerConfig.from_dict({"server": {"port": "x"}}, env={})
    assert str(ei.value) == "server.port: expected an integer in 0..65535, got 'x'"
    with pytest.raises(ConfigError) as ei:
        ServerConfig.from_dict({"llm": {"base_url": ["http://x"]}}, env={})
    assert "['http://x']" in str(ei.value)


class Creds(Settings):
    db_password: str = ""
    client_secret: str = ""
    opaque: str = Field("", json_schema_extra={"secret": True})
    hidden: str = Field("", repr=False)
    token_budget: int = 0            # a number of tokens, not a token
    api_key_env: str = ""            # the name of a variable, not the key

    @field_validator("db_password")
    @classmethod
    def _long(cls, v: str) -> str:
        if len(v) < 30:
            raise Invalid(f"expected at least 30 characters, got {v!r}")   # a careless validator
        return v


@pytest.mark.parametrize("key, value, leaked", [
    ("db_password", "hunter2-password", "hunter2"),
    ("client_secret", ["s3cr3t-value"], "s3cr3t"),
    ("opaque", ["opaque-value"], "opaque-value"),
    ("hidden", 42, "42"),
])
def test_secret_fields_by_name_or_marker(key, value, leaked):
    with pytest.raises(Invalid) as ei:
        Creds.from_dict({key: value})
    assert ei.value.loc == (key,) and leaked not in ei.value.message and "redacted" in ei.value.message


def test_names_that_only_mention_a_secret_word_are_not_secret():
    for key, value in (("token_budget", "many"), ("api_key_env", ["X"])):
        with pytest.raises(Invalid) as ei:
            Creds.from_dict({key: value})
        assert repr(value) in ei.value.message
    is_secret, redacted = settings.is_secret, settings.redacted
    assert is_secret(("llm", "api_key"), None) and is_secret(("users", 0, "token_sha256"), None)
    assert not is_secret(("memory", "token_counter"), None)
    assert redacted(True) == "<true or false, redacted>" and redacted(1.5) == "<a number, redacted>"

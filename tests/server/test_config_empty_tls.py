"""An empty tls_cert or tls_key is a configuration error, from any source: ``NPLT_TLS_CERT="$CERT"``,
``--tls-cert "$CERT"`` with CERT unset, or ``tls_cert = ""`` in the file. It used to start a
plain-TCP server without a word next to a set tls_key ("both or neither" compared with None only)."""
from __future__ import annotations

from pathlib import Path

import pytest

from server.cli import load_config
from server.config_base import ConfigError

DATA = Path(__file__).parent / "data"
CERT, KEY = str(DATA / "test_cert.pem"), str(DATA / "test_key.pem")


def _load(tmp_path, argv=(), env=None, toml=None):
    path = None
    if toml is not None:
        path = tmp_path / "server.toml"
        path.write_text(toml)
    return load_config(["--data-dir", str(tmp_path / "data"), *argv], env=env or {}, path=path)


@pytest.mark.parametrize("source", ["env", "flag", "file"])
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_cert_next_to_a_key_is_an_error_naming_the_key(tmp_path, source, empty):
    if source == "env":
        kw = {"env": {"NPLT_TLS_CERT": empty}, "toml": f'[server]\ntls_cert = "{CERT}"\ntls_key = "{KEY}"\n'}
    elif source == "flag":
        kw = {"argv": ["--tls-cert", empty, "--tls-key", KEY]}
    else:
        kw = {"toml": f'[server]\ntls_cert = "{empty}"\ntls_key = "{KEY}"\n'}
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, **kw)
    assert ei.value.path == "server.tls_cert"
    assert ei.value.message.startswith(f"expected the path of a PEM file, got {empty!r}")


def test_an_empty_key_or_an_empty_pair_is_an_error_too(tmp_path):
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, env={"NPLT_TLS_CERT": CERT, "NPLT_TLS_KEY": ""})
    assert ei.value.path == "server.tls_key"
    with pytest.raises(ConfigError) as ei:             # both variables from unset shell variables
        _load(tmp_path, env={"NPLT_TLS_CERT": "", "NPLT_TLS_KEY": ""})
    assert ei.value.path == "server.tls_cert"


def test_tls_is_off_only_when_both_are_left_out(tmp_path):
    cfg = _load(tmp_path)
    assert (cfg.server.tls_cert, cfg.server.tls_key) == (None, None)
    cfg = _load(tmp_path, env={"NPLT_TLS_CERT": CERT, "NPLT_TLS_KEY": KEY})
    assert (cfg.server.tls_cert, cfg.server.tls_key) == (CERT, KEY)

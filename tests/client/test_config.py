"""Client configuration: file, environment and flag precedence, validation, TLS contexts; the
user's folders (config, saved state, log)."""
from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from client.config import ClientConfig, ClientConfigError, TlsConfig
from client.main import LOG_BYTES, build_parser
from client.tui.saved import MAX_HISTORY, SavedState

CERT = Path(__file__).parent / "certs" / "cert.pem"


def load(argv: list[str], env: dict[str, str] | None = None) -> ClientConfig:
    return ClientConfig.load(build_parser().parse_args(argv), env=env or {})


def test_defaults_without_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load([])
    assert (cfg.host, cfg.port, cfg.token, cfg.theme, cfg.page_size) == ("127.0.0.1", 9999, None, "textual-dark", 50)
    assert cfg.tls.context() is None and cfg.keymap == {}


def test_precedence_flags_env_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('host = "file-host"\nport = 1000\ntoken = "file-token"\ntheme = "nord"\n'
                 '[keymap]\n"session.new" = "f5"\n')
    cfg = load(["--config", str(f)])
    assert (cfg.host, cfg.port, cfg.token, cfg.theme, cfg.keymap) == ("file-host", 1000, "file-token", "nord",
                                                                      {"session.new": "f5"})
    env = {"NPLT_CLIENT_PORT": "2000", "NPLT_CLIENT_TOKEN": "env-token"}
    cfg = load(["--config", str(f)], env)
    assert (cfg.host, cfg.port, cfg.token) == ("file-host", 2000, "env-token")
    cfg = load(["--config", str(f), "--port", "3000", "--host", "flag-host"], env)
    assert (cfg.host, cfg.port, cfg.token) == ("flag-host", 3000, "env-token")
    cfg = load([], {"NPLT_CLIENT_CONFIG": str(f)})
    assert cfg.host == "file-host"


@pytest.mark.parametrize("text, path", [
    ('port = "x"\n', "port"),
    ("port = 70000\n", "port"),
    ("colour = 1\n", "colour"),
    ("[tls]\nverify = true\n", "tls.verify"),
    ("[keymap]\n\"session.new\" = 5\n", "keymap"),
    ("page_size = 0\n", "page_size"),
    ("not toml", "cannot read"),
])
def test_file_errors_name_the_key(tmp_path: Path, text: str, path: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ClientConfigError) as info:
        load(["--config", str(f)])
    assert path in str(info.value)


def test_env_errors() -> None:
    with pytest.raises(ClientConfigError, match="NPLT_CLIENT_PORT"):
        load([], {"NPLT_CLIENT_PORT": "abc"})
    with pytest.raises(ClientConfigError, match="NPLT_CLIENT_TLS"):
        load([], {"NPLT_CLIENT_TLS": "maybe"})


def test_tls_options(tmp_path: Path) -> None:
    cfg = load(["--tls-ca", str(CERT)])
    ctx = cfg.tls.context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    cfg = load(["--tls-insecure"])
    ctx = cfg.tls.context()
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    assert load([], {"NPLT_CLIENT_TLS": "1"}).tls.enabled
    with pytest.raises(ClientConfigError, match="tls.ca_file"):
        TlsConfig(ca_file=str(tmp_path / "none.pem")).context()


def test_the_default_config_file_follows_xdg_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "nplt").mkdir(parents=True)
    (tmp_path / "xdg" / "nplt" / "client.toml").write_text('host = "xdg-host"\n')
    assert load([]).host == "xdg-host"


def test_saved_tui_state_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "state" / "tui.json"
    assert SavedState.load(path) == SavedState()                      # first run
    SavedState("nord", ["one", "two"]).save(path)
    assert SavedState.load(path) == SavedState("nord", ["one", "two"])
    SavedState(None, [str(i) for i in range(MAX_HISTORY + 50)]).save(path)
    assert len(SavedState.load(path).history) == MAX_HISTORY
    for bad in ("{not json", "[1, 2]", '{"theme": 3, "history": "x"}'):
        path.write_text(bad)
        assert SavedState.load(path) == SavedState()


def test_saving_merges_what_several_tuis_add(tmp_path: Path) -> None:
    """Two TUIs share the file: each update re-reads it and adds only its own new inputs."""
    path = tmp_path / "state" / "tui.json"
    SavedState("nord", ["ls", "pwd"]).save(path)
    assert SavedState.update(path, added=["from A"]) == SavedState("nord", ["ls", "pwd", "from A"])
    assert SavedState.update(path, theme="dracula", added=["from B", "ls"]) == SavedState(
        "dracula", ["pwd", "from A", "from B", "ls"])                 # deduplicated: "ls" at its newest place
    assert SavedState.update(path, added=[]) == SavedState.load(path) == SavedState(
        "dracula", ["pwd", "from A", "from B", "ls"])                 # no theme given: the file's is kept
    SavedState.update(path, added=[f"n{i}" for i in range(MAX_HISTORY + 10)])
    assert SavedState.load(path).history == [f"n{i}" for i in range(10, MAX_HISTORY + 10)]   # capped, newest kept
    path.unlink()

    def tui(name: str) -> None:                                        # two processes saving at once
        for i in range(40):
            SavedState.update(path, added=[f"{name}{i}"])
    threads = [threading.Thread(target=tui, args=(name,)) for name in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    history = SavedState.load(path).history
    assert sorted(history) == sorted(f"{n}{i}" for n in "AB" for i in range(40))
    assert [h for h in history if h[0] == "A"] == [f"A{i}" for i in range(40)]   # each in its own order
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]


LOG_SCRIPT = """
import logging
from client import paths
from client.main import LOG_BYTES, log_to_file
log_to_file()
log = logging.getLogger("nplt.client")
log.warning("first line")
for i in range(LOG_BYTES // 1000 + 50):    # past LOG_BYTES: the file rotates
    log.info("filler %06d %s", i, "x" * 960)
print(paths.log_file())
"""


@pytest.mark.parametrize("xdg", [True, False], ids=["xdg", "home"])
def test_the_client_log_rotates_in_the_platformdirs_log_folder(tmp_path: Path, xdg: bool) -> None:
    """The TUI's log (client.main.log_to_file) is a rotating file in the user's log folder:
    $XDG_STATE_HOME/nplt/log (platformdirs), else ~/.local/state/nplt/log; never the current folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(tmp_path / "home")
    if xdg:
        env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    expected = (tmp_path / "state" if xdg else tmp_path / "home" / ".local" / "state") / "nplt" / "log" / "client.log"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", LOG_SCRIPT], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == expected
    rotated = expected.with_name("client.log.1")
    assert expected.is_file() and rotated.is_file()
    assert "first line" in rotated.read_text(encoding="utf-8")          # the oldest lines moved on rotation
    assert expected.stat().st_size <= LOG_BYTES and not list(cwd.iterdir())

"""Suite-wide settings: Hypothesis profiles.

default: modest example counts so `make test` stays fast. long: many more examples, for `make fuzz`
(selected by NPLT_FUZZ=1 or ``--hypothesis-profile=long``).
"""
from __future__ import annotations

import os

import pytest

from hypothesis import HealthCheck, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("default", max_examples=60, deadline=None, suppress_health_check=_SUPPRESS)
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=_SUPPRESS)
if os.environ.get("NPLT_FUZZ"):
    settings.load_profile("long")
elif settings.get_current_profile_name() == "default":
    settings.load_profile("default")  # activate the re-registered default; keep any --hypothesis-profile


@pytest.fixture(scope="session")
def restartable_server():
    """A second embedded PostgreSQL, for the tests that stop and start it (tests/pg, tests/cluster;
    each leaves it running): one for the whole session, started on first use."""
    from pg.pgserver import EmbeddedPostgres
    server = EmbeddedPostgres().start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def isolated_client_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user config file or NPLT_CLIENT_* variable of the machine leaks into a test that runs the
    client (autouse in tests/client; other modules calling ``client.main.main`` ask for it)."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    for key in [k for k in os.environ if k.startswith(("NPLT_CLIENT_", "XDG_"))]:
        monkeypatch.delenv(key)   # platformdirs folders (config, state, logs, documents) follow HOME

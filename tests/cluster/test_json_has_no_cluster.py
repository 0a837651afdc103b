"""The JSON backend pays nothing for the cluster: no cluster component, no relay on the hub, and
neither server.cluster nor asyncpg imported (checked in a fresh interpreter)."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_json_server_has_no_cluster_component(tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, sys
        from server.app import Server
        from testkit.echo_agent import EchoAgent
        from testkit.server import make_config
        from pathlib import Path

        async def main():
            srv = Server(make_config(Path({str(tmp_path)!r})), agent=EchoAgent(), memory="basic")
            await srv.start()
            try:
                assert srv.services.cluster is None and srv.hub.relay is None
                assert srv.runner.lock is None
            finally:
                await srv.stop()
            loaded = [m for m in ("server.cluster", "server.cluster_relay", "asyncpg") if m in sys.modules]
            assert not loaded, loaded
            print("ok")
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

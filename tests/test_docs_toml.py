"""Every ```toml block of the README and docs/ is valid TOML, and every server configuration block is
accepted by the server's own loader once its placeholders are filled: an operator copies them."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from server.config import ServerConfig

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```toml\n(.*?)^```", re.S | re.M)
CLIENT_DOCS = {"docs/client.md"}          # its block is the client's config file, not the server's
PLACEHOLDER = re.compile(r'"<[^"]*>"|"\.\.\."')     # "<64 hex digits ...>", "..."


def blocks() -> list[tuple[str, int, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(1)))
    return found


def test_the_docs_have_toml_blocks() -> None:
    assert len(blocks()) >= 5


@pytest.mark.parametrize("where,line,block", blocks(), ids=lambda v: str(v)[:40])
def test_a_toml_block_is_valid_and_a_server_block_loads(where: str, line: int, block: str, tmp_path: Path) -> None:
    try:
        data = tomllib.loads(block)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{where}:{line}: not valid TOML: {exc}")
    if where in CLIENT_DOCS:
        return
    n = iter(range(10, 100))         # each placeholder its own value (two users cannot share a token)
    data = tomllib.loads(PLACEHOLDER.sub(lambda _: f'"{next(n)}' + "a" * 62 + '"', block))
    for section in ("server",):      # files named in the examples need not exist on this machine
        for key in ("tls_cert", "tls_key"):
            data.get(section, {}).pop(key, None)
    data.setdefault("storage", {})["root"] = str(tmp_path / "history")
    if "summarization" in data:
        data["summarization"].pop("model", None)
    ServerConfig.from_dict(data, env={})

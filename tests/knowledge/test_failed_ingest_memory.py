"""A failed ingest gives its memory back when the call ends, without a garbage-collector run.

Before, the ingest's ``job`` future held the parser's exception, whose traceback held the frames of
``KnowledgeBase.ingest`` (holding ``job``: a reference cycle) and of ``_stage`` / ``parse`` (holding
the file's bytes and the parser's locals): each refused upload kept about its size until a full
collection, which a busy server rarely runs (5 refused 80 MB pdfs: RSS 78 -> 470 MB).
"""
from __future__ import annotations

import gc
import os
import time
import tracemalloc

import pytest

from server.errors import HandlerError
from server.knowledge import KnowledgeBase, KnowledgeConfig
from testkit.server import poll

SIZE = 8_000_000
RELEASE_DEADLINE_S = 5.0


@pytest.fixture
def gc_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("name, make", [
    ("junk.pdf", lambda: b"%PDF-1.4\n" + os.urandom(SIZE) + b"\nstartxref\n9\n%%EOF\n"),   # corrupt pdf (pypdf)
    ("long.txt", lambda: b"word " * (SIZE // 5)),                                          # over max_extracted_chars
])
async def test_a_refused_document_is_freed_when_the_ingest_returns(tmp_path, gc_off, name, make):
    kb = KnowledgeBase(KnowledgeConfig(max_extracted_chars=SIZE // 2), tmp_path / "kb")
    await kb.start()
    try:
        path = tmp_path / "upload.part"                # as the v2/v3 uploads pass it: a path, read by the stage
        path.write_bytes(make())
        with pytest.raises(HandlerError):            # warm-up: lazy imports (pypdf) are not counted
            await kb.ingest("alice", [], None, name, path)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            with pytest.raises(HandlerError) as err:
                await kb.ingest("alice", [], None, name, path)
            assert err.value.code == "UNSUPPORTED_MEDIA"
            peak = tracemalloc.get_traced_memory()[1] - base
            assert peak >= SIZE                    # the bytes were read (the measure sees them)
            del err
            started = time.monotonic()
            retained = lambda: tracemalloc.get_traced_memory()[0] - base  # noqa: E731
            try:                                   # (a worker thread lets go of its work item a moment later)
                await poll(lambda: retained() < SIZE // 4, RELEASE_DEADLINE_S, "memory given back")
            except AssertionError:
                raise AssertionError(f"{retained()} bytes still held {time.monotonic() - started:.1f} s after "
                                     f"a refused {SIZE}-byte {name} (gc disabled)") from None
        finally:
            tracemalloc.stop()
    finally:
        await kb.close()

"""Crash safety: a real subprocess ingesting a document is SIGKILLed at each step; after a restart
the document exists whole (listed, searchable, bytes intact) or not at all (no debris left)."""
from __future__ import annotations

import hashlib
import textwrap

import pytest

from server.knowledge import KnowledgeBase, KnowledgeConfig
from testkit.process import kill_at_point

DOC = ("# Failover\n\n" + "".join(f"Step {i}: promote replica {i} and check lag.\n\n" for i in range(400))).encode()

CHILD = textwrap.dedent('''
    import asyncio, sys
    from server.knowledge import KnowledgeBase, KnowledgeConfig
    from server.knowledge import kb as kb_module, store as store_module

    point, root, path = sys.argv[1], sys.argv[2], sys.argv[3]

    def halt(tag):
        print(tag, flush=True)
        sys.stdin.readline()                 # blocks until the parent kills this process

    def wrap(module, name, before):
        real = getattr(module, name)
        def f(*a, **k):
            if before:
                halt(point)
            out = real(*a, **k)
            if not before:
                halt(point)
            return out
        setattr(module, name, f)

    if point == "parsing":
        wrap(kb_module, "parse", True)
    elif point == "chunks-written":
        wrap(kb_module, "write_json", False)
    elif point == "before-rename":
        wrap(store_module, "_fsync_dir", True)
    elif point == "after-rename":
        real_rename = store_module.os.rename
        class OsProxy:
            def __getattr__(self, name):
                return getattr(__import__("os"), name)
            def rename(self, a, b):
                real_rename(a, b)
                halt(point)
        store_module.os = OsProxy()

    async def main():
        kb = KnowledgeBase(KnowledgeConfig(), root)
        await kb.start()
        def progress(stage, done, total):
            if point == "receiving" and stage == "receiving" and done:
                halt(point)
        await kb.ingest("alice", [], None, "failover.md", path, progress=progress)
        halt("done")

    asyncio.run(main())
''')


@pytest.mark.parametrize("point", ["receiving", "parsing", "chunks-written", "before-rename", "after-rename", "done"])
async def test_sigkill_during_ingest_leaves_the_document_whole_or_absent(tmp_path, point):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    src = tmp_path / "failover.md"
    src.write_bytes(DOC)
    root = tmp_path / "kb"
    kill_at_point(script, point, str(root), str(src), point=point)
    kb = KnowledgeBase(KnowledgeConfig(), root)
    await kb.start()
    try:
        docs = await kb.list("alice", [])
        committed = point in ("after-rename", "done")
        assert len(docs) == (1 if committed else 0)
        assert not list(kb.store.tmp.iterdir()) and not list(kb.store.trash.iterdir())
        if committed:
            info = docs[0]
            _, f = await kb.open_document("alice", [], info.doc_id)
            with f:
                assert hashlib.md5(f.read()).hexdigest() == info.md5 == hashlib.md5(DOC).hexdigest()
            assert len(kb.index) == info.chunks > 1
            assert (await kb.search("alice", [], "promote replica 399", 1))[0].doc_id == info.doc_id
        again = await kb.ingest("alice", [], None, "failover.md", DOC)  # the upload can simply be retried
        assert again.duplicate == committed
    finally:
        await kb.close()

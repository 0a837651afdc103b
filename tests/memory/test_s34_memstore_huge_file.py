"""A user memory file with far more entries than ``max_items`` (written by hand, or under a higher
setting) is cut to the newest ``max_items`` as it is read, in the worker thread that reads it, with a
WARNING naming the user and how many were dropped, and written back so cut; no change then runs over
more (before: 200,000 items were accepted whole, MEMORY_LIST returned them, and the first write ran
its change over all of them on the event loop, holding every user's requests for 12 s). A change over
more than ``INLINE_CHANGE_ENTRIES`` entries (``max_items`` set that high) runs in a worker thread."""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from protocol import MsgType as T
from server.memory.user_files import JsonUserMemoryStore
from server.memory.user_store import INLINE_CHANGE_ENTRIES, MemoryItem, UserDoc
from testkit.process import ServerProcess
from testkit.server import V3Client

USER = "local"                              # single-user mode
SID = "s_20250101_000000000000"
MAX_ITEMS = 200                             # user_memory.max_items, the default


def item(i: int) -> MemoryItem:
    return MemoryItem(f"m{i:012x}", "fact", f"The service {i} host is h{i}.internal", SID, i + 1,
                      "2025-01-01T00:00:00+00:00")


def write_doc(root: Path, user: str, doc: UserDoc) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / (hashlib.sha256(user.encode()).hexdigest()[:32] + ".json")
    path.write_text(json.dumps(doc.to_json(user)))
    return path


async def test_an_oversized_memory_file_is_cut_to_the_newest_as_it_is_read(tmp_path):
    n = 5_000
    doc = UserDoc([item(i) for i in range(n)], {f"s{i}": i for i in range(MAX_ITEMS + 7)},
                  [(SID, i, "ab" * 16) for i in range(MAX_ITEMS + 3)])
    path = write_doc(tmp_path / "data" / "user_memory", USER, doc)
    srv = await ServerProcess.start(tmp_path / "data")
    try:
        c = await V3Client.connect(srv.addr)
        listed = (await c.call(T.MEMORY_LIST))["items"]
        assert [i["text"] for i in listed] == [f"The service {i} host is h{i}.internal" for i in range(n - MAX_ITEMS, n)]
        on_disk = json.loads(path.read_text())            # written back cut: not parsed whole again
        assert len(on_disk["items"]) == MAX_ITEMS and on_disk["items"][-1]["text"] == listed[-1]["text"]
        assert len(on_disk["learned"]) == MAX_ITEMS and len(on_disk["forgotten"]) == MAX_ITEMS
        r = await c.call(T.CHAT_TEXT, text="remember that the service y host is hy.internal")
        end = (await c.turn_events(r["turn_id"], timeout=30))[-1]
        assert end.type == T.TURN_END and end.body["message"]["content"].startswith("Noted:"), end.body
        texts = [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]
        assert len(texts) == MAX_ITEMS and texts[-1] == "The service y host is hy.internal"
        assert texts[0] == f"The service {n - MAX_ITEMS + 1} host is h{n - MAX_ITEMS + 1}.internal"
        await c.close()
    finally:
        assert await srv.stop() == 0
    warnings = [json.loads(line) for line in srv.log_path.read_text().splitlines()
                if "holds more than max_items" in line]
    assert len(warnings) == 1, warnings
    text = warnings[0]["msg"]
    assert warnings[0]["level"] == "warning" and "'local'" in text and f"{n - MAX_ITEMS} items" in text and "7 learned" in text and "3 forgotten" in text


async def test_a_store_cuts_a_document_its_backend_read_whole(tmp_path, caplog):
    """The store caps what any backend gives (PostgreSQL's rows are parsed without ``max_items``)."""
    path = write_doc(tmp_path, "bob", UserDoc([item(i) for i in range(50)]))
    store = JsonUserMemoryStore(tmp_path, max_items=10)
    store.backend.max_items = None                        # a backend that reads the document whole
    try:
        caplog.set_level("WARNING", logger="nplt.memory")
        got = await store.list("bob")
        assert [i.id for i in got] == [item(i).id for i in range(40, 50)]
        assert "user memory of user 'bob' holds more than max_items (10)" in caplog.text and "40 items" in caplog.text
        assert len(json.loads(path.read_text())["items"]) == 50     # (this backend does not write it back)
    finally:
        await store.close()


async def test_a_change_over_many_entries_runs_off_the_event_loop(tmp_path):
    """``max_items`` set high: a change over more than INLINE_CHANGE_ENTRIES entries is not run on the
    loop (``key`` is called for every item in it); a small one is."""
    n = INLINE_CHANGE_ENTRIES + 10
    write_doc(tmp_path, "carol", UserDoc([item(i) for i in range(n)]))
    write_doc(tmp_path, "dave", UserDoc([item(i) for i in range(10)]))
    store = JsonUserMemoryStore(tmp_path, max_items=n + 100)
    threads: dict[str, set[str]] = {"carol": set(), "dave": set()}
    try:
        for user in threads:
            def key(it: MemoryItem, user: str = user) -> str | None:
                threads[user].add(threading.current_thread().name)
                return None
            added = await store.add(user, [MemoryItem("mnew", "fact", "The new host is hn.internal", "s2", 1,
                                                      "2025-01-02T00:00:00+00:00")], learned=("s2", 1), key=key)
            assert [i.id for i in added] == ["mnew"]
        loop_thread = threading.current_thread().name
        assert threads["carol"] and loop_thread not in threads["carol"]
        assert threads["dave"] == {loop_thread}
        assert len(await store.list("carol")) == n + 1
    finally:
        await store.close()

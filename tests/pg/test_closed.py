"""Calls after close() are refused with StorageClosed (SHUTTING_DOWN). (The JSON backend's
AsyncHistoryStore raises RuntimeError from its stopped thread pool instead, so this is not yet in
the shared suite.)"""
from __future__ import annotations

import pytest

from storage import StorageClosed, StorageConfig
from storage.port import open_store


async def test_calls_after_close_are_refused(pg_url):
    st = await open_store(StorageConfig(url=pg_url))
    sid = (await st.create("alice")).session_id
    await st.close()
    await st.close()                                    # idempotent
    for call in (st.get(sid), st.append(sid, "user", "late"), st.create("alice"), st.list("alice")):
        with pytest.raises(StorageClosed) as err:
            await call
        assert err.value.code == "SHUTTING_DOWN"

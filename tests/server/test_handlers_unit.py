"""Handlers called directly with a RequestContext and a fake port: no TCP, no connection object."""
from __future__ import annotations

import errno

import pytest

from protocol import ErrorCode, MsgType
from protocol.messages import ChatSend, HistoryPage, SessionDelete, SessionNew, SessionSwitch, Stats
from server.conn_state import TRANSITIONS, BadTransition, ConnState, check
from server.errors import HandlerError, failure_of
from server.handlers.dispatch import HANDLERS, run_handler
from storage.errors import NotFound, StorageError
from testkit.server import FakePort, handler_services, hello_context, poll


async def test_hello_attaches_the_port_and_a_new_session_is_announced(tmp_path):
    async with handler_services(tmp_path) as svc:
        port = FakePort()
        ctx = await hello_context(svc, port)
        assert port.user_id == "local" and port.session_id is not None
        first = port.session_id
        reply = await HANDLERS[MsgType.SESSION_NEW](ctx, SessionNew(id=2, title="second"))
        assert reply.session.title == "second" and port.session_id == reply.session.session_id != first
        kinds = [e.kind for e in port.of_type(MsgType.SESSION_EVENT)]
        assert kinds[-1] == "created"
        switched = await HANDLERS[MsgType.SESSION_SWITCH](ctx, SessionSwitch(id=3, session_id=first))
        assert switched.session.session_id == first == port.session_id


async def test_chat_send_streams_turn_events_to_the_sender(tmp_path):
    async with handler_services(tmp_path) as svc:
        port = FakePort()
        ctx = await hello_context(svc, port)
        reply = await HANDLERS[MsgType.CHAT_TEXT](ctx, ChatSend(id=7, text="hello"))
        assert reply.queued == 0 and reply.user_message.id == 1
        await poll(lambda: port.of_type(MsgType.TURN_END))
        mine = [(t, re) for t, _, m, re in port.events if m]
        assert mine and all(re == 7 for _, re in mine)
        end = port.of_type(MsgType.TURN_END)[0]
        assert end.message.content == "echo: hello" and end.turn_id == reply.turn_id


async def test_delete_moves_other_subscribers_and_tells_them(tmp_path):
    async with handler_services(tmp_path) as svc:
        a, b = FakePort(), FakePort()
        ctx_a = await hello_context(svc, a)
        older = a.session_id
        await HANDLERS[MsgType.SESSION_NEW](ctx_a, SessionNew(id=2))
        await hello_context(svc, b)
        assert a.session_id == b.session_id != older
        gone = a.session_id
        reply = await HANDLERS[MsgType.SESSION_DELETE](ctx_a, SessionDelete(id=3, session_id=gone))
        assert reply.session_id == gone and a.session_id == b.session_id == older
        assert b.moved == [(gone, older)] and a.moved == []   # the requester gets the reply instead


async def test_deleting_the_last_session_leaves_v3_connections_without_one_and_creates_none(tmp_path):
    """(review s31: each CLI delete or purge of the last live session made a new empty "New chat")"""
    async with handler_services(tmp_path) as svc:
        a, b = FakePort(), FakePort()
        ctx_a = await hello_context(svc, a)
        await hello_context(svc, b)
        gone = a.session_id
        reply = await HANDLERS[MsgType.SESSION_DELETE](ctx_a, SessionDelete(id=2, session_id=gone))
        assert reply.session_id == gone and reply.current is None
        assert a.session_id is None and b.session_id is None and b.moved == []
        assert await svc.sessions.newest("local") is None              # no session was created
        assert not svc.hub.session_subscribers(gone)


async def test_stats_counts_without_a_listener(tmp_path):
    async with handler_services(tmp_path) as svc:
        ctx = await hello_context(svc)
        reply = await HANDLERS[MsgType.STATS](ctx, Stats(id=2))
        assert reply.clients == 0 and reply.turns_total == 0 and reply.agent.name == "echo"


class FullDisk:
    """The real store, whose appends fail like a full disk while ``full`` is set."""

    def __init__(self, store):
        self.store = store
        self.full = False
        self.fail_role: str | None = None     # only appends of this role fail (None: all)

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def append(self, session_id, role, content, **kw):
        if self.full and (self.fail_role is None or role == self.fail_role):
            raise OSError(errno.ENOSPC, "No space left on device")
        return await self.store.append(session_id, role, content, **kw)


async def test_a_full_disk_is_storage_error_and_nothing_is_acknowledged(tmp_path):
    from storage import AsyncHistoryStore
    from testkit.server import make_config
    real = await AsyncHistoryStore.open(make_config(tmp_path).storage)
    disk = FullDisk(real)
    async with handler_services(tmp_path, store=disk) as svc:
        port = FakePort()
        ctx = await hello_context(svc, port)
        disk.full = True
        body, err = await run_handler(HANDLERS[MsgType.CHAT_TEXT], ctx, ChatSend(id=2, text="hello"))
        assert body is None and err.code is ErrorCode.STORAGE_ERROR and "No space left" in err.message
        page = await real.page(port.session_id)
        assert page.total == 0 and not svc.runner.is_running(port.session_id)   # nothing stored, no turn
        disk.full = False   # the disk has room again: the same session works
        body, err = await run_handler(HANDLERS[MsgType.CHAT_TEXT], ctx, ChatSend(id=3, text="again"))
        assert err is None and body.user_message.id == 1


async def test_an_answer_that_cannot_be_stored_is_storage_error_not_session_gone(tmp_path):
    from storage import AsyncHistoryStore
    from testkit.server import make_config
    real = await AsyncHistoryStore.open(make_config(tmp_path).storage)
    disk = FullDisk(real)
    disk.fail_role = "assistant"
    async with handler_services(tmp_path, store=disk) as svc:
        port = FakePort()
        ctx = await hello_context(svc, port)
        disk.full = True
        reply = await HANDLERS[MsgType.CHAT_TEXT](ctx, ChatSend(id=2, text="hello"))
        await poll(lambda: port.of_type(MsgType.TURN_ERROR))
        err = port.of_type(MsgType.TURN_ERROR)[0]
        assert err.code is ErrorCode.STORAGE_ERROR and err.turn_id == reply.turn_id
        assert not port.of_type(MsgType.TURN_END)
        page = await real.page(port.session_id)
        assert [m.role for m in page.messages] == ["user"]       # the question was stored, no answer


async def test_history_page_read_failure_is_storage_error(tmp_path):
    async with handler_services(tmp_path) as svc:
        ctx = await hello_context(svc)

        async def broken_page(*a, **kw):
            raise OSError(errno.EIO, "Input/output error")
        svc.store.page = svc.store.page_encoded = broken_page
        _, err = await run_handler(HANDLERS[MsgType.HISTORY_REQUEST], ctx, HistoryPage(id=2))
        assert err.code is ErrorCode.STORAGE_ERROR


async def test_a_session_really_gone_is_still_not_found(tmp_path):
    async with handler_services(tmp_path) as svc:
        ctx = await hello_context(svc)
        sid = ctx.session_id
        await svc.store.delete(sid)
        _, err = await run_handler(HANDLERS[MsgType.CHAT_TEXT], ctx, ChatSend(id=2, text="hi"))
        assert err.code is ErrorCode.NOT_FOUND


def test_failures_map_by_code():
    class IOFailure(StorageError):
        code = ErrorCode.STORAGE_ERROR
    assert failure_of(IOFailure("disk")).code is ErrorCode.STORAGE_ERROR
    with pytest.raises(ValueError):
        class Typo(StorageError):       # noqa: F841 - a storage code must be a protocol code
            code = "STORAGE_EROR"
    assert failure_of(NotFound("x")).code is ErrorCode.NOT_FOUND
    assert failure_of(OSError(errno.ENOSPC, "No space left on device")).code is ErrorCode.STORAGE_ERROR
    assert failure_of(ValueError("a bug")) is None      # a bug: logged and answered INTERNAL
    with pytest.raises(TypeError):
        HandlerError("NOT_FOUND", "strings are not codes")  # type: ignore[arg-type]


def test_connection_state_table():
    assert check(ConnState.GRACE, ConnState.HANDSHAKING) is ConnState.HANDSHAKING
    assert check(ConnState.HANDSHAKING, ConnState.READY) is ConnState.READY
    with pytest.raises(BadTransition):
        check(ConnState.LEGACY, ConnState.READY)
    with pytest.raises(BadTransition):
        check(ConnState.CLOSED, ConnState.CLOSING)
    assert set(TRANSITIONS) == set(ConnState)
    assert all(ConnState.CLOSED in TRANSITIONS[s] for s in ConnState if s is not ConnState.CLOSED)


async def test_a_session_update_after_the_store_closed_is_skipped_not_raised(tmp_path):
    """A turn ending during shutdown publishes SESSION_EVENT updated from a task; when that task runs
    after the store closed it must end quietly (it was logged as 'background task failed')."""
    async with handler_services(tmp_path) as svc:
        port = FakePort()
        await hello_context(svc, port)
        session_id = port.session_id
        await svc.store.close()
        before = len(port.events)
        await svc.sessions.publish_updated(session_id)   # raised StorageClosed before the fix
        assert len(port.events) == before


async def test_history_page_inline_path_gives_the_task_paths_reply(tmp_path):
    """The dispatcher's inline history page (loaded, idle, the user's) is the handler's reply byte
    for byte; a session that is not the user's, or not loaded, goes to the task path (None)."""
    import orjson

    from server.handlers.dispatch import INLINE
    from server.wire import encode_reply
    async with handler_services(tmp_path) as svc:
        ctx = await hello_context(svc)
        sid = ctx.session_id
        for i in range(12):
            await svc.store.append(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
        for req in (HistoryPage(id=5), HistoryPage(id=5, before=7, limit=3), HistoryPage(id=5, limit=50)):
            now = INLINE[MsgType.HISTORY_REQUEST](ctx, req)
            assert now is not None
            later, err = await run_handler(HANDLERS[MsgType.HISTORY_REQUEST], ctx, req)
            assert err is None
            assert orjson.dumps(encode_reply(5, now)) == orjson.dumps(encode_reply(5, later))
        other = await svc.store.create("someone else")
        assert INLINE[MsgType.HISTORY_REQUEST](ctx, HistoryPage(id=6, session_id=other.session_id)) is None
        _, err = await run_handler(HANDLERS[MsgType.HISTORY_REQUEST], ctx, HistoryPage(id=6, session_id=other.session_id))
        assert err.code is ErrorCode.NOT_FOUND
        cache = svc.store.sync.cache                       # evicted (once idle: background work may hold it)
        await poll(lambda: (s := cache.get(sid)) is None or cache.evict(s))
        assert INLINE[MsgType.HISTORY_REQUEST](ctx, HistoryPage(id=7)) is None

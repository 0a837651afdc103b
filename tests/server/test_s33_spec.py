"""Review s33, protocol conformance over TCP against a real server:

- a request id of 2^64 or more is answered ERROR INVALID_MESSAGE ``"re": null`` naming it "a number
  over 2^64-1" (before: "got 1.8446744073709552e+19", a float the client never sent);
- CLIENT_KILL's ``peer`` is checked (§5.9: "ip:port" or "ip"; "[ipv6]:port" for IPv6): a value that
  is no address is INVALID_MESSAGE (before: NOT_FOUND "no other connection matches peer 'not an
  ip'"); addresses are compared as addresses (an IPv4-mapped IPv6 form, an IPv6 peer with or
  without brackets).
"""
from __future__ import annotations

from protocol import MsgType
from protocol.messages import ClientKill, peer_forms
from protocol.objects import ClientInfo
from server.auth import hash_token
from server.handlers.admin import _matches
from testkit.server import ReplyError, V3Client, poll, running_server

T = MsgType
USERS = {"auth": {"users": [{"user_id": "root", "token_sha256": hash_token("t-root"), "admin": True},
                            {"user_id": "bob", "token_sha256": hash_token("t-bob")}]}}
TOO_BIG = b"18446744073709551616"          # 2**64


async def _error(client: V3Client, msg_type: int, **body) -> dict:
    try:
        await client.call(msg_type, **body)
    except ReplyError as exc:
        return exc.body
    raise AssertionError("expected an ERROR")


async def test_an_id_over_2_64_minus_1_is_refused_with_re_null_and_named(tmp_path):
    async with running_server(tmp_path) as (srv, addr):
        c = await V3Client.connect(addr)
        for t in (T.SESSION_LIST, T.PING, T.KB_LIST):
            c.send_bytes(c.codec.send_raw(t, b'{"id":' + TOO_BIG + b"}"))
            err = (await c.wait_type(T.ERROR)).body
            assert err["re"] is None and err["code"] == "INVALID_MESSAGE" and err["fatal"] is False, err
            assert err["message"].endswith("got a number over 2^64-1") and "e+19" not in err["message"], err
        assert (await c.call(T.PING))["re"]                        # still usable
        assert not any(m.type == T.PONG for m in c.inbox)          # no PONG for the bad PING
        await c.close()


async def test_client_kill_checks_peer_and_compares_addresses(tmp_path):
    async with running_server(tmp_path, sections=USERS) as (srv, addr):
        root = await V3Client.connect(addr, token="t-root")
        bob1 = await V3Client.connect(addr, token="t-bob")
        bob2 = await V3Client.connect(addr, token="t-bob")
        await poll(lambda: len(srv.connections) == 3)
        for bad in ("not an ip", "localhost", "127.0.0.1:99999", "[127.0.0.1]:80"):
            err = await _error(root, T.CLIENT_KILL, peer=bad)
            assert err["code"] == "INVALID_MESSAGE" and err["message"].startswith("field 'peer'"), (bad, err)
        for nobody in ("10.9.9.9", "[::1]:1", "::1", "127.0.0.2"):     # well-formed, matching nothing
            assert (await _error(root, T.CLIENT_KILL, peer=nobody))["code"] == "NOT_FOUND", nobody
        clients = (await root.call(T.CLIENT_LIST))["clients"]
        b1, b2 = [c for c in clients if c["user"] == "bob"]
        # one connection by "ip:port", as CLIENT_LIST shows it
        assert (await root.call(T.CLIENT_KILL, peer=b1["peer"]))["killed"] == [b1["id"]]
        await bob1.wait_closed()
        # the IPv4-mapped IPv6 form of the address is the same address
        assert (await root.call(T.CLIENT_KILL, peer="::ffff:127.0.0.1"))["killed"] == [b2["id"]]
        await bob2.wait_closed()
        assert [c["id"] for c in (await root.call(T.CLIENT_LIST))["clients"]] == [clients[0]["id"]]
        await root.close()


def test_ipv6_peers_match_with_or_without_brackets():
    def kills(shown: str, peer: str) -> bool:
        return _matches(ClientInfo(7, shown, "bob"), ClientKill(1, peer=peer), peer_forms(peer))

    for shown in ("::1:5000", "[::1]:5000"):      # the peer as a connection names it, either form
        assert kills(shown, "[::1]:5000") and kills(shown, "::1") and kills(shown, "[::1]")
        assert kills(shown, "0:0::1") and kills(shown, "::1:5000")
        assert not kills(shown, "[::1]:5001") and not kills(shown, "::2") and not kills(shown, "127.0.0.1")
    assert kills("10.0.0.1:80", "::ffff:10.0.0.1") and kills("::ffff:10.0.0.1:80", "10.0.0.1:80")
    assert not kills("?", "127.0.0.1")            # not connected yet: no address


async def test_hello_announces_the_knowledge_base_memory_and_admin_rights_the_user_has(tmp_path):
    """Capabilities beyond the fixed list: ``kb`` (the server has a knowledge base), ``memory``
    (long-term memory is on), ``admin`` (this user may list and kill clients); before, none of them
    could be detected."""
    async with running_server(tmp_path, sections=USERS) as (srv, addr):
        root = await V3Client.connect(addr, token="t-root")
        bob = await V3Client.connect(addr, token="t-bob")
        assert {"kb", "admin"} <= set(root.hello["capabilities"])
        assert "kb" in bob.hello["capabilities"] and "admin" not in bob.hello["capabilities"]
        assert "memory" not in bob.hello["capabilities"]          # the test server's basic memory: none
        await root.close()
        await bob.close()


async def test_an_unchanged_session_prompt_sends_no_session_event(tmp_path):
    """SESSION_EVENT "updated" follows a change of the system prompt (§5.2), not a SESSION_PROMPT that
    leaves it as it was (before, every one sent it)."""
    async with running_server(tmp_path) as (srv, addr):
        a = await V3Client.connect(addr)
        b = await V3Client.connect(addr, session_id=a.session_id)
        await a.call(T.SESSION_PROMPT, system_prompt="Answer briefly.")
        await b.wait_type(T.SESSION_EVENT)
        b.inbox.clear()
        await a.call(T.SESSION_PROMPT, system_prompt="Answer briefly.")    # the same: no event
        await a.call(T.SESSION_PROMPT, system_prompt="Answer in detail.")  # a change: one event
        event = await b.wait_type(T.SESSION_EVENT)
        assert event.body["session"]["session_id"] == a.session_id
        pong = await b.request(T.PING, id="sync")     # b's stream is ordered: what came before is in
        assert pong.type == T.PONG
        assert not [m for m in b.inbox if m.type == T.SESSION_EVENT]        # only the one of the change
        await a.close()
        await b.close()

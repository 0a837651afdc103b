"""S34 (fix-memstore, item 3): long-term memory kept secrets worded as a pre-shared key, an unseal or
recovery key or a service's "auth" ("The VPN PSK is x7Kp9Qz2Lm.", "The vault unseal key is
7f3a9c2e1b.", "记住 redis 的 auth 是 R3disAuthVal") and quoted them in other sessions ("From what you
told me earlier: - The VPN PSK is x7Kp9Qz2Lm."). ``sensitive.mentions_secret`` now names those keys,
"<x> key is <value>" with a value like a key (``KEY_VALUE_CHARS``, letters and digits) and "auth
is/是 <value>" with such a value; "the key point", "keyboard", "primary key is id", "auth service is
on port 443" and "auth 服务在 10.0.0.5" stay ordinary facts. Over the wire: a real server (the offline
agent, the rules) keeps none of them and a fresh session's question gets no value back."""
from __future__ import annotations

import pytest

from protocol import MsgType as T
from server.app import Server
from server.memory.distill import distill_rules
from server.memory.sensitive import mentions_secret
from testkit.server import V3Client, answer_text, make_config, poll

SECRETS = [
    "The VPN PSK is x7Kp9Qz2Lm.", "Remember that the VPN PSK is x7Kp9Qz2Lm.", "the psk: hello",
    "The pre-shared key is hello", "the preshared key for site B is abc", "Our pre shared key is letmein",
    "Remember that the vault unseal key is 7f3a9c2e1b.", "The unseal keys are in the safe", "unseal_key=abc",
    "The recovery key is ABCD-EFGH-IJKL", "the BitLocker recovery keys are on the share", "Recovery code: 1234",
    "The master key is Zm9vYmFy", "The encryption key is 3f8a9c2b11", "the decryption key is aa",
    "The license key is XXXX-YYYY", "The wifi key is CafeWifi2024", "The WPA key is CafeWifi",
    "The backup key is 9a8b7c6d5e", "the ssh key is AAAAC3NzaC1lZDI1NTE5", "key = Zx81kQp9",
    "记住 redis 的 auth 是 R3disAuthVal", "redis 的 auth 为 R3dis2024", "The redis auth is hunter22",
    "auth: R3disAuthVal", "redis auth = s3cr3tVal", "the auth key is abc", "Remember the auth key",
    "The redis AUTH is P4ssw0rd!", "记住 redis 的 auth 是 R3disAuthVal。", "The backup key is Pa$$word",
]
NOT_SECRETS = [
    "The key point is latency", "the key point: latency", "The keyboard layout is US", "My keyboard is a Model M",
    "The primary key is id", "The primary key is user_id", "the primary key is the id column",
    "The sort key is created_at", "The partition key is tenant-42", "The redis key is user:123",
    "The S3 key is backups/2024/db.tar.gz", "The SSH key is in ~/.ssh/id_ed25519", "The key is in the drawer",
    "The hotkey is ctrl-k", "The monkey is 12345678ab", "key metrics are CPU and RAM",
    "auth service is on port 443", "The auth service is on port 443", "auth 服务在 10.0.0.5",
    "auth 服务的地址是 10.0.0.5", "The auth service runs on auth-1.internal", "auth is handled by keycloak",
    "We use LDAP for auth", "auth is LDAP", "auth: OAuth2", "auth is SSO", "The auth host is auth-2",
    "OAuth2 is the auth method", "author is Bob", "The author is bob2024xy", "authentication is required",
    "The primary key is (tenant, id)", "The cache key is v2", "The key is 'id'", "key: 5432",
    "log in as root with SSH keys", "我们用 ssh key 登录堡垒机", "The WPA2-Enterprise wifi uses 802.1X",
]


@pytest.mark.parametrize("text", SECRETS)
def test_keys_and_auth_values_are_secrets(text):
    assert mentions_secret(text)


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_ordinary_key_and_auth_facts_are_no_secrets(text):
    assert not mentions_secret(text)


@pytest.mark.parametrize("text", ["Remember that the VPN PSK is x7Kp9Qz2Lm.",
                                  "Remember that the vault unseal key is 7f3a9c2e1b.",
                                  "记住 redis 的 auth 是 R3disAuthVal"])
def test_the_rules_keep_no_key(text):
    assert distill_rules(text) == []


@pytest.mark.parametrize("text,kept", [
    ("Remember that the primary key is id", "The primary key is id"),
    ("Remember that the auth service is on port 443", "The auth service is on port 443"),
    ("记住：auth 服务的地址是 10.0.0.5", "Auth 服务的地址是 10.0.0.5"),
])
def test_the_rules_still_keep_look_alike_facts(text, kept):
    assert [t for _, t in distill_rules(text)] == [kept]


async def test_a_key_is_not_kept_nor_repeated_in_another_session(tmp_path):
    srv = Server(make_config(tmp_path))
    addr = await srv.start()
    try:
        c = await V3Client.connect(addr)
        for text in ("Remember that the VPN PSK is x7Kp9Qz2Lm.", "Remember that the vault unseal key is 7f3a9c2e1b.",
                     "记住 redis 的 auth 是 R3disAuthVal", "Remember that the marker host is marker-1."):
            r = await c.call(T.CHAT_TEXT, text=text)
            events = await c.turn_events(r["turn_id"], timeout=30)
            assert events[-1].type == T.TURN_END, events[-1].body

        async def items() -> list[str]:
            return [i["text"] for i in (await c.call(T.MEMORY_LIST))["items"]]
        await poll(lambda: _has_marker(items), timeout=15, what="the marker learned")
        assert await items() == ["The marker host is marker-1."]
        await c.call(T.SESSION_NEW)
        for question in ("what is the VPN PSK?", "what is the vault unseal key?", "redis 的 auth 是什么？"):
            r = await c.call(T.CHAT_TEXT, text=question)
            events = await c.turn_events(r["turn_id"], timeout=30)
            said = answer_text(events) + events[-1].body["message"]["content"]
            for value in ("x7Kp9Qz2Lm", "7f3a9c2e1b", "R3disAuthVal"):
                assert value not in said, said
        await c.close()
    finally:
        await srv.stop()


async def _has_marker(items) -> bool:
    return any("marker-1" in t for t in await items())


def test_long_inputs_are_judged():
    assert mentions_secret("auth: " + "a1" * 20000)
    for text in ("key is " * 5000, "key is " + "a-" * 20000 + "!", "key " * 3000 + "is x"):
        assert not mentions_secret(text)

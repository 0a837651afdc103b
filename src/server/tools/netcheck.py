"""The ``network_check`` tool: DNS resolution and a TCP connect, restricted to allowed hosts.

A target is allowed when the host as given is listed in ``tools.allowed_hosts`` (a name, an IP
address or inside a CIDR network) AND every address it resolves to is listed as well, so a
listed name cannot be pointed somewhere else through DNS.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from typing import Any

from server.tools.config import ToolsConfig
from server.tools.units import ToolFailure

NETWORK_CHECK_SCHEMA = {
    "type": "object",
    "properties": {
        "host": {"type": "string", "minLength": 1, "maxLength": 253,
                 "description": "Host name or IP address (only hosts allowed by the server config)."},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "TCP port."},
        "timeout": {"type": "number", "minimum": 0.05, "maximum": 10,
                    "description": "Connect timeout in seconds (default 3)."},
    },
    "required": ["host", "port"],
    "additionalProperties": False,
}


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


class HostPolicy:
    """The allowlist: names (case-insensitive), IP addresses and CIDR networks."""

    def __init__(self, entries: list[str]) -> None:
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            e = entry.strip().lower().rstrip(".")
            ip = _parse_ip(e)
            if ip is not None:
                self.networks.append(ipaddress.ip_network(ip))
            elif "/" in e:
                self.networks.append(ipaddress.ip_network(e, strict=False))
            else:
                self.names.add(e)

    def address_allowed(self, address: str) -> bool:
        ip = _parse_ip(address)
        if ip is None:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.networks)

    def host_allowed(self, host: str) -> bool:
        h = host.strip().lower().rstrip(".")
        return self.address_allowed(h) if _parse_ip(h) is not None else h in self.names


async def _resolve(host: str, port: int, timeout: float) -> list[tuple[int, str]]:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except TimeoutError:
        raise ToolFailure(f"DNS resolution of '{host}' timed out after {timeout:g} s") from None
    except socket.gaierror as e:
        raise ToolFailure(f"DNS resolution of '{host}' failed: {e.strerror or e}") from None
    out: list[tuple[int, str]] = []
    for family, _, _, _, sockaddr in infos:
        item = (family, str(sockaddr[0]))
        if item not in out:
            out.append(item)
    return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__


async def network_check(cfg: ToolsConfig, policy: HostPolicy, host: str, port: int,
                        timeout: float | None) -> dict[str, Any]:
    """Resolve ``host`` and try a TCP connect to each address in turn until one succeeds."""
    timeout = min(timeout if timeout is not None else cfg.network_timeout_s, cfg.max_network_timeout_s)
    if not policy.host_allowed(host):
        raise ToolFailure(f"host '{host}' is not allowed: network_check may only contact hosts listed in "
                          "the server's tools.allowed_hosts setting (loopback by default)")
    deadline = time.monotonic() + timeout
    resolved = await _resolve(host, port, timeout)
    if not resolved:
        raise ToolFailure(f"'{host}' resolved to no address")
    denied = [addr for _, addr in resolved if not policy.address_allowed(addr)]
    if denied:
        raise ToolFailure(f"host '{host}' resolves to {', '.join(denied)}, which is not allowed "
                          "(every resolved address must be listed in tools.allowed_hosts)")
    attempts: list[dict[str, Any]] = []
    result: dict[str, Any] = {"host": host, "port": port, "resolved": [a for _, a in resolved],
                              "reachable": False, "timeout_s": timeout}
    for _, address in resolved:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            attempts.append({"address": address, "result": "timed out"})
            break
        start = time.perf_counter()
        try:
            async with asyncio.timeout(remaining):
                _, writer = await asyncio.open_connection(address, port)
        except (OSError, TimeoutError) as e:
            attempts.append({"address": address, "result": _describe(e)})
            continue
        latency = (time.perf_counter() - start) * 1000
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        attempts.append({"address": address, "result": "open"})
        result.update(reachable=True, address=address, latency_ms=round(latency, 2))
        break
    result["attempts"] = attempts
    return result

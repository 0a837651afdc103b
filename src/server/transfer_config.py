"""The [transfer] config section: v2 file uploads and the UDP download sender (docs/knowledge.md, "v2 clients").

The upload size limit is the knowledge base's own (``[knowledge] max_upload_bytes``), shared with v3.
The UDP endpoint binds ``udp_host`` (default: the NPLT host) on ``udp_port`` (0: chosen by the OS); a
non-loopback address follows the NPLT port's rule (refused in single-user mode unless ``insecure``).

Abuse limits of the UDP sender (the client names the UDP port, so nothing proves it listens there): a
transfer ends when the v2 connection that asked for it closes; until a first valid ACK, only the oldest
packet is resent, with exponential backoff, and the transfer is given up after ``udp_first_ack_s``;
at most ``max_udp_transfers_per_client`` downloads run at once to one client IP address.
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from server.config_base import Section


class TransferConfig(Section):
    """[transfer]: limits of v2 uploads and of UDP downloads."""
    section: ClassVar[str] = "transfer"
    udp_host: str | None = None            # None (or ""): the [server] host
    udp_port: int = Field(0, ge=0, le=65535)   # 0: an OS-chosen port (announced in every DOWNLOAD_OFFER)
    max_udp_transfers: int = Field(8, ge=1, le=10_000)   # concurrent UDP downloads, server-wide
    max_udp_transfers_per_client: int = Field(2, ge=1, le=10_000)   # concurrent UDP downloads to one client IP
    udp_first_ack_s: float = Field(5.0, ge=0.05, le=60.0)   # no valid ACK at all for this long: the download is given up
    udp_give_up_s: float = Field(30.0, ge=0.05, le=3_600.0)   # a download with no ACK progress for this long is abandoned
    udp_retransmit_s: float = Field(0.1, ge=0.001, le=60.0)   # Go-Back-N retransmission timeout (the deployed clients' value)
    udp_window: int = Field(5, ge=1, le=1024)   # Go-Back-N window in packets (the deployed clients' value)
    v2_upload_timeout_s: float = Field(30.0, ge=0.05, le=86_400.0)   # a v2 upload with no FILE_DATA for this long is abandoned
    v2_upload_buffer_bytes: int = Field(256 * 1024, ge=4096, le=64 << 20)   # bytes of an upload held before a write to disk

    @field_validator("udp_host")
    @classmethod
    def _empty_is_default(cls, v: str | None) -> str | None:
        return v or None

"""The [transfer] config section: v2 file uploads and the UDP download sender (docs/knowledge.md, "v2 clients").

The upload size limit is the knowledge base's own (``[knowledge] max_upload_bytes``), shared with v3.
The UDP endpoint binds ``udp_host`` (default: the NPLT host) on ``udp_port`` (0: chosen by the OS); a
non-loopback address follows the NPLT port's rule (refused in single-user mode unless ``insecure``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from server.config_base import check_keys, get_float, get_int, get_str


@dataclass(slots=True)
class TransferConfig:
    """[transfer]: limits of v2 uploads and of UDP downloads."""
    udp_host: str | None = None            # None: the [server] host
    udp_port: int = 0                      # 0: an OS-chosen port (announced in every DOWNLOAD_OFFER)
    max_udp_transfers: int = 8             # concurrent UDP downloads, server-wide
    udp_give_up_s: float = 30.0            # a download with no ACK progress for this long is abandoned
    udp_retransmit_s: float = 0.1          # Go-Back-N retransmission timeout (the deployed clients' value)
    udp_window: int = 5                    # Go-Back-N window in packets (the deployed clients' value)
    v2_upload_timeout_s: float = 30.0      # a v2 upload with no FILE_DATA for this long is abandoned
    v2_upload_buffer_bytes: int = 256 * 1024   # bytes of an upload held in memory before a write to disk

    @classmethod
    def from_dict(cls, d: dict) -> TransferConfig:
        s, df = "transfer", cls()
        check_keys(s, d, {f.name for f in dataclasses.fields(cls)})
        return cls(
            udp_host=get_str(s, d, "udp_host", df.udp_host) or None,
            udp_port=get_int(s, d, "udp_port", df.udp_port, 0, 65535),
            max_udp_transfers=get_int(s, d, "max_udp_transfers", df.max_udp_transfers, 1, 10_000),
            udp_give_up_s=get_float(s, d, "udp_give_up_s", df.udp_give_up_s, 0.05, 3_600.0),
            udp_retransmit_s=get_float(s, d, "udp_retransmit_s", df.udp_retransmit_s, 0.001, 60.0),
            udp_window=get_int(s, d, "udp_window", df.udp_window, 1, 1024),
            v2_upload_timeout_s=get_float(s, d, "v2_upload_timeout_s", df.v2_upload_timeout_s, 0.05, 86_400.0),
            v2_upload_buffer_bytes=get_int(s, d, "v2_upload_buffer_bytes", df.v2_upload_buffer_bytes,
                                           4096, 64 << 20),
        )

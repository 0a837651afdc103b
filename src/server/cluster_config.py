"""The [cluster] config section: timings of several nodes on one PostgreSQL (docs/cluster.md).

Used only when ``[storage] url`` selects PostgreSQL; with the JSON backend the section is read and
checked but nothing uses it.
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from server.config_base import Section


class ClusterConfig(Section):
    """[cluster]: how nodes batch and wait for each other."""
    section: ClassVar[str] = "cluster"
    delta_batch_ms: float = Field(3.0, ge=0.0, le=1_000.0)   # deltas of one turn sent within this interval share a notification
    remote_end_wait_ms: float = Field(500.0, ge=0.0, le=60_000.0)   # a turn taking over a session waits this long at most
    #                                                               for the previous (other node's) turn's TURN_END
    ending_turn_wait_ms: float = Field(1000.0, ge=0.0, le=60_000.0)   # a regenerate or edit finding the session locked
    #      by another node waits this long at most for it (its turn may be ending: TURN_END goes before the lock)
    hello_wait_ms: float = Field(1000.0, ge=0.0, le=60_000.0)   # a starting node waits this long at most for the others to know it
    remote_cancel_wait_ms: float = Field(2000.0, ge=0.0, le=60_000.0)   # a CHAT_CANCEL of a turn not on this node waits
    #                                                                    this long at most for the node that has it
    remote_state_wait_ms: float = Field(500.0, ge=0.0, le=60_000.0)   # a SESSION_SWITCH or HELLO attaching to a session
    #                                                                  whose turn runs on another node waits this long at most for its state
    dead_node_retry_ms: float = Field(250.0, ge=1.0, le=60_000.0)   # a watched node whose liveness lock is free while
    #      it still has a connection, or a session of a turn it ran is still locked (it is reconnecting: PostgreSQL
    #      restarted; or its backends are still exiting), is checked again after this long
    reconnect_grace_ms: float = Field(10_000.0, ge=0.0, le=60_000.0)   # after a watch's own connection broke (PostgreSQL
    #      restarted, say), a watched node without a connection is not taken for dead before this long (at least
    #      2 x pg_retry_backoff_ms: a live node takes its locks back within one pg_retry_backoff_ms of PostgreSQL's return)

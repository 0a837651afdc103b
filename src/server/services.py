"""Services: everything a request handler may use, built once by ``server.app.Server.start``.

Handlers and adapters receive this object (inside a ``RequestContext``) instead of reaching through
the connection to the server: what a handler can touch is exactly what is listed here.
"""
from __future__ import annotations

import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable

from server.auth import Authenticator
from server.config import LimitsConfig, ServerConfig
from server.handlers.knowledge_uploads import UploadService
from server.handlers.upload_sharing import UploadSharing
from server.conn_limits import InputBudget
from server.hub import Hub
from server.knowledge import KnowledgeBase
from server.tools.knowledge import KnowledgeSource
from server.agent.transcript import readable_history
from server.pipeline import TurnPipeline, recall_step
from server.metrics import Metrics
from server.recovery import marker_for
from server.offers import OfferService
from server.refusals import Refusals
from server.rx_budget import RxScheduler
from server.sessions import SessionService
from server.turns import TurnRunner
from server.udp_transfer import UdpTransfer
from server.wiring import build_runtime

VERSION = "0.1.0"


@dataclass
class Counters:
    """Server-wide figures reported by STATS."""
    started_monotonic: float = field(default_factory=time.monotonic)
    slow_consumers: int = 0
    refusals: Refusals = field(default_factory=Refusals)


@dataclass
class Services:
    config: ServerConfig
    store: Any                 # storage.AsyncHistoryStore (or a stand-in with the same methods)
    hub: Hub
    sessions: SessionService
    runner: TurnRunner
    agent: Any                 # server.agent.base.Agent
    memory: Any                # server.memory.MemoryManager or server.basic_memory.BasicMemory
    auth: Authenticator
    counters: Counters
    connections: set[Any] = field(default_factory=set)   # open connections (STATS "clients")
    metrics: Metrics = field(default_factory=Metrics)    # GET /metrics (server.httpd)
    rx: RxScheduler = field(default_factory=RxScheduler)  # the loop's share for received bytes
    knowledge: KnowledgeBase | None = None               # documents (docs/knowledge.md); started by the app
    uploads: UploadService | None = None                 # v3 uploads in progress (docs/protocol.md §5.8)
    udp: UdpTransfer | None = None    # v2 downloads over UDP (started by the Server)
    offers: OfferService | None = None
    input_budget: InputBudget = field(default_factory=InputBudget)  # max_total_input_buffer
    cluster: Any = None        # server.cluster.Cluster when storage is PostgreSQL, else None
    version: str = VERSION
    exports: Any = None        # server.handlers.history.ExportSlots (max_concurrent_exports), made on first use

    @property
    def limits(self) -> LimitsConfig:
        return self.config.limits

    def sessions_loaded(self) -> int:
        count = getattr(self.store.sync, "loaded_count", None)
        if callable(count):
            count = count()
        return int(count) if count is not None else self.hub.attached_sessions()


def knowledge_store(config: ServerConfig, store: Any) -> Any:
    """The knowledge base's document store: PostgreSQL when the history is (the same database, so
    every node sees every document), else None (files under ``<storage root>/knowledge``)."""
    if getattr(store, "link", None) is None:
        return None
    from server.knowledge.pg_store import PgDocumentStore, pg_limits   # (not imported on the JSON backend)
    return PgDocumentStore(store.link, Path(config.storage.root) / "knowledge", pg_limits(config.knowledge))


def build_services(config: ServerConfig, store: Any, notify: Callable[..., Any], *, agent: Any = None,
                   memory: Any = None, counters: Counters | None = None) -> Services:
    """Every service, once, in dependency order: hub -> knowledge -> (agent, memory) -> sessions ->
    cluster (PostgreSQL storage only) -> runner.

    ``store`` is an open AsyncHistoryStore; ``agent`` and ``memory`` are built from the config unless
    given (``memory="basic"``: BasicMemory); ``notify`` is the memory layer's callback.
    """
    hub = Hub()
    data = Path(config.storage.root)
    auth = Authenticator(config.auth)
    knowledge = KnowledgeBase(config.knowledge, data / "knowledge", store=knowledge_store(config, store),
                              groups_of=auth.groups_of)
    udp = UdpTransfer(config.transfer)
    offers = OfferService(knowledge, hub, udp, groups_of=auth.groups_of)
    source = KnowledgeSource(knowledge, auth.groups_of)
    agent, memory = build_runtime(config, store, notify, agent, memory, knowledge=source,
                                  offers=offers.offer_in_session)
    pipeline = TurnPipeline.default(memory)        # replayed passages of documents no longer readable: stubbed
    pipeline.replace("recall", readable_history(recall_step(memory), source))
    sessions = SessionService(store, hub, agent, memory, limits=config.limits)
    metrics = Metrics()
    cluster = None
    if getattr(store, "link", None) is not None:   # PostgreSQL: other nodes may share the database
        from server.cluster import Cluster         # (not imported at all on the JSON backend)
        cluster = Cluster(store, hub, sessions, config.cluster)
    runner = TurnRunner(store=store, sessions=sessions, hub=hub, agent=agent, memory=memory,
                        limits=config.limits, max_message_bytes=config.storage.max_message_bytes, metrics=metrics,
                        lock=cluster.turn_lock if cluster is not None else None,
                        inflight=marker_for(store), pipeline=pipeline)
    sessions.turns = runner
    if cluster is not None:                        # delete / clear stop the turns of every node
        from server.cluster_cancel import TurnControlAcrossNodes
        cluster.remote_cancel.runner = runner
        cluster.remote_state.runner = runner
        sessions.turns = TurnControlAcrossNodes(runner, cluster)
    offers.turns = runner
    return Services(config=config, store=store, hub=hub, sessions=sessions, runner=runner, agent=agent,
                    memory=memory, auth=auth, counters=counters or Counters(),
                    metrics=metrics, knowledge=knowledge,
                    uploads=UploadService(config.knowledge, data / "uploads", sharing=_upload_sharing(config, store)),
                    udp=udp, offers=offers, cluster=cluster)


def _upload_sharing(config: ServerConfig, store: Any) -> UploadSharing | None:
    """PostgreSQL: the uploads in progress shared by the nodes (a resume through any node)."""
    if getattr(store, "link", None) is None:
        return None
    from storage.pg.upload_parts import PgUploadParts   # (not imported on the JSON backend)
    return UploadSharing(config.knowledge, PgUploadParts(store.link))

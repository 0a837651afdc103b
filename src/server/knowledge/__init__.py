"""Knowledge base: document ingestion (parse, chunk, index, crash-safe storage) and hybrid
retrieval with citations, isolated per user and group. See docs/knowledge.md."""
from server.knowledge.chunker import citation, format_location
from server.knowledge.config import KnowledgeConfig
from server.knowledge.kb import KnowledgeBase
from server.knowledge.models import DocumentInfo, Hit

__all__ = ["KnowledgeBase", "KnowledgeConfig", "DocumentInfo", "Hit", "citation", "format_location"]

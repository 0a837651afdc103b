"""Knowledge base: document ingestion (parse, chunk, index, crash-safe storage) and hybrid
retrieval with citations, isolated per user and group. See docs/knowledge.md."""
from .chunker import citation, format_location
from .config import KnowledgeConfig
from .kb import KnowledgeBase
from .models import DocumentInfo, Hit

__all__ = ["KnowledgeBase", "KnowledgeConfig", "DocumentInfo", "Hit", "citation", "format_location"]

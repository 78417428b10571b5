"""What the app holds while it runs: settings, metrics and, once loaded, the search service."""

from __future__ import annotations

from dataclasses import dataclass, field

from retriever_server.api.metrics import ServiceMetrics
from retriever_server.api.schemas import LoadProgress
from retriever_server.api.service import SearchService
from retriever_server.settings import Settings


@dataclass
class AppState:
    settings: Settings
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    service: SearchService | None = None
    index_path: str | None = None
    error: str | None = None
    """Why loading failed, if it did."""
    progress: LoadProgress | None = None
    """While loading: the step under way and how far it got (written by the loading thread)."""

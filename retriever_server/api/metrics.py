"""Prometheus metrics of one app instance (a registry per app, so tests can create several)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class ServiceMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("retriever_requests", "HTTP requests", ["path", "status"], registry=r)
        self.latency = Histogram(
            "retriever_request_latency_seconds", "Request latency", ["path"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queries = Counter("retriever_queries", "Queries received in /retrieve requests", registry=r)
        self.batch_size = Histogram(
            "retriever_batch_queries", "Queries per coalesced encoder+index batch", buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_latency = Histogram(
            "retriever_batch_latency_seconds",
            "Search time of one coalesced batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_hits = Counter("retriever_cache_hits", "Queries answered from the LRU cache", registry=r)
        self.cache_misses = Counter("retriever_cache_misses", "Queries sent to the index", registry=r)
        self.documents = Gauge("retriever_index_documents", "Documents in the loaded index", registry=r)
        self.ready = Gauge("retriever_ready", "1 once the index is loaded", registry=r)
        self.shed = Counter(
            "retriever_shed_requests", "Requests refused with 503 because the estimated wait was too long", registry=r
        )
        self.search_failures = Counter(
            "retriever_search_failures", "Requests whose own queries made the search backend fail", registry=r
        )
        self.estimated_wait = Gauge(
            "retriever_estimated_wait_seconds", "Estimated queue wait of the latest request at its arrival", registry=r
        )

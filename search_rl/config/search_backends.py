"""``retriever.*``: how the rollout searches (``RetrieverClientConfig``: the HTTP retriever's client, and
``backend``, which picks the search backend), the other backends' settings (``retriever.web.*``,
``retriever.simulated.*``) and the retrieval recordings (``retriever.recording.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from retriever_server.settings import DEFAULT_URL
from search_rl.config.loading import ConfigError

SEARCH_BACKENDS = ("http", "web", "simulated", "replay")
"""Valid ``retriever.backend`` values."""
WEB_PROVIDERS = ("serper", "brave")
"""Valid ``retriever.web.provider`` values."""
RECORDING_MODES = ("off", "record", "replay", "cache")
"""Valid ``retriever.recording.mode`` values."""


@dataclass
class WebSearchConfig:
    """A web search API as the search engine (``retriever.backend=web``): one adapter per provider."""

    provider: str = "serper"
    """``serper`` (google.serper.dev) or ``brave`` (api.search.brave.com)."""
    endpoint: str | None = None
    """The provider's search URL; ``null`` = its public one (tests point it at a local server)."""
    api_key_env: str | None = None
    """Environment variable holding the API key; ``null`` = ``SERPER_API_KEY`` or ``BRAVE_API_KEY``. The key itself
    is never a config value, so it never reaches a config dump or a log."""
    passages: str = "snippet"
    """What a passage holds: the result's ``snippet``, or the ``page`` text fetched from its link (one more request
    per result, not billed by the provider)."""
    page_chars: int = 1500
    """Characters of fetched page text kept per passage (``passages=page``)."""
    timeout_s: float = 20.0
    """Timeout of one request to the provider, in seconds."""
    max_concurrency: int = 4
    """Provider requests in flight at once."""
    requests_per_s: float = 5.0
    """Most requests started per second (the plan's rate limit); 0 = unlimited."""
    retry_window_s: float = 60.0
    """How long one query is retried on 429 (after the provider's ``Retry-After`` or rate-limit reset) and 5xx."""
    cost_per_call_usd: float = 0.001
    """Estimated price of one search call, for the cost meter and ``max_cost_usd`` (check the provider's plan)."""
    max_calls: int | None = None
    """Budget: most billed calls of this process; the run stops with ``SearchBudgetExhausted`` when spent."""
    max_cost_usd: float | None = None
    """Budget: most estimated spend of this process in USD (``cost_per_call_usd`` times the calls)."""
    country: str = "us"
    """Result country (Serper ``gl``, Brave ``country``); part of the backend fingerprint."""
    language: str = "en"
    """Result language (Serper ``hl``, Brave ``search_lang``); part of the backend fingerprint."""

    def __post_init__(self) -> None:
        if self.provider not in WEB_PROVIDERS:
            raise ConfigError(f"retriever.web.provider must be one of {WEB_PROVIDERS}, got {self.provider!r}")
        if self.passages not in ("snippet", "page"):
            raise ConfigError(f"retriever.web.passages must be 'snippet' or 'page', got {self.passages!r}")
        if self.timeout_s <= 0 or self.max_concurrency < 1 or self.page_chars < 1:
            raise ConfigError("retriever.web.timeout_s must be > 0, max_concurrency and page_chars >= 1")
        if min(self.requests_per_s, self.retry_window_s, self.cost_per_call_usd) < 0:
            raise ConfigError("retriever.web.requests_per_s, retry_window_s and cost_per_call_usd must be >= 0")
        if (self.max_calls is not None and self.max_calls < 0) or (self.max_cost_usd or 0) < 0:
            raise ConfigError("retriever.web.max_calls and max_cost_usd must be >= 0 (or null: no budget)")

    @property
    def key_env(self) -> str:
        """The environment variable the key is read from."""
        return self.api_key_env or f"{self.provider.upper()}_API_KEY"


@dataclass
class SimulatedSearchConfig:
    """A language model that writes the documents for a query (``retriever.backend=simulated``, ZeroSearch's idea)."""

    model: str = "smollm2-135m-instruct"
    """Local model writing the documents (``tiny``, the packaged SmolLM2 GGUF, a .gguf file or an HF folder); unused
    when ``endpoint`` is set."""
    endpoint: str | None = None
    """Base URL of an OpenAI-compatible server (``{endpoint}/chat/completions``); ``null`` = the local ``model``."""
    endpoint_model: str = "default"
    """The ``model`` field sent to the endpoint."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the endpoint's key (sent as a bearer token when set; never logged)."""
    max_doc_tokens: int = 64
    """Tokens generated per document."""
    temperature: float = 0.0
    """Sampling temperature of the writer (0 = greedy: the same query gets the same documents)."""
    seed: int = 0
    """Sampling seed of the writer (part of the fingerprint)."""
    timeout_s: float = 60.0
    """Timeout of one endpoint request, in seconds."""

    def __post_init__(self) -> None:
        if self.max_doc_tokens < 1 or self.timeout_s <= 0 or self.temperature < 0:
            raise ConfigError("retriever.simulated.max_doc_tokens must be >= 1, timeout_s > 0, temperature >= 0")


@dataclass
class RecordingConfig:
    """The retrieval recording: a SQLite file of (query, top-k, backend fingerprint) -> passages, and of (document
    id, max characters, backend fingerprint) -> article for the ``open`` tool."""

    mode: str = "off"
    """``off``; ``record`` (every search goes to the backend and is written); ``replay`` (answers only from the
    file); ``cache`` (answers hits from the file, searches and writes misses)."""
    path: str | None = None
    """The recording file (created when missing); required unless ``mode=off``."""
    on_miss: str = "error"
    """``replay`` only: a query missing from the recording is an error (``error``) or is searched live (``live``,
    not with ``retriever.backend=replay``)."""
    fingerprint: str | None = None
    """``retriever.backend=replay``: which recorded backend to answer as (an id from ``python -m
    search_rl.tools.recordings list``); ``null`` = the only one in the file."""

    def __post_init__(self) -> None:
        if self.mode not in RECORDING_MODES:
            raise ConfigError(f"retriever.recording.mode must be one of {RECORDING_MODES}, got {self.mode!r}")
        if self.on_miss not in ("error", "live"):
            raise ConfigError(f"retriever.recording.on_miss must be 'error' or 'live', got {self.on_miss!r}")
        if self.mode != "off" and not self.path:
            raise ConfigError(
                f"retriever.recording.mode={self.mode} needs retriever.recording.path (a SQLite file, e.g. "
                "runs/retrievals.sqlite)"
            )


def check_backend(backend: str, recording: RecordingConfig) -> None:
    """Cross-field checks of ``retriever.backend`` and ``retriever.recording``.

    Raises:
        ConfigError: an unknown backend, or ``replay`` without a recording file to answer from.
    """
    if backend not in SEARCH_BACKENDS:
        raise ConfigError(f"retriever.backend must be one of {SEARCH_BACKENDS}, got {backend!r}")
    if backend == "replay":
        if not recording.path:
            raise ConfigError("retriever.backend=replay needs retriever.recording.path (the recording to answer from)")
        if recording.on_miss == "live":
            raise ConfigError("retriever.backend=replay has no live backend; set retriever.recording.on_miss=error")


@dataclass
class RetrieverClientConfig:
    """How the rollout searches: the retriever service (``POST {url}/retrieve``) or another backend, and whether
    each retrieval is recorded or replayed (docs/retriever.md, "Search backends")."""

    backend: str = "http"
    """Search backend: ``http`` (the retriever service at ``url``), ``web`` (a web search API, ``retriever.web``),
    ``simulated`` (a language model writes the documents, ``retriever.simulated``) or ``replay`` (answers only from
    the recording ``retriever.recording.path``)."""
    url: str = DEFAULT_URL
    """Base URL(s) of the retriever, comma-separated for several replicas (used round-robin, with failover).
    A trailing ``/retrieve`` is accepted and stripped. Hydra needs the list quoted, and the shell needs that quote
    kept: ``"retriever.url='http://a:8000,http://b:8000'"``."""
    topk: int = 3
    """Passages returned per query."""
    timeout_s: float = 30.0
    """Timeout of one HTTP request (connect, read, write and pool), in seconds."""
    retry_window_s: float = 60.0
    """How long a request is retried on connection errors, timeouts and 5xx/429 answers, in seconds from its first
    attempt; the default outlasts a retriever restart (a dense server loads its index first). 0 = one attempt."""
    max_retries: int | None = None
    """Also stop after this many retries (``null`` = only ``retry_window_s`` limits them)."""
    backoff_s: float = 0.5
    """Wait before the first retry; doubled each further retry, capped at ``backoff_max_s``."""
    backoff_max_s: float = 8.0
    """Longest wait between two retries, in seconds."""
    max_queries_per_request: int = 64
    """Queries per HTTP request; larger batches are split into chunks sent concurrently."""
    max_concurrency: int = 8
    """Most requests in flight at once from one client."""
    trust_env: bool = False
    """Honour HTTP(S)_PROXY/NO_PROXY environment variables (off: the retriever is normally on a private network)."""
    web: WebSearchConfig = field(default_factory=WebSearchConfig)
    """Settings of ``backend=web``."""
    simulated: SimulatedSearchConfig = field(default_factory=SimulatedSearchConfig)
    """Settings of ``backend=simulated``."""
    recording: RecordingConfig = field(default_factory=RecordingConfig)
    """Record every retrieval to a SQLite file, or answer from one (any backend)."""

    def __post_init__(self) -> None:
        check_backend(self.backend, self.recording)
        if not self.urls:
            raise ValueError(f"retriever.url is empty; give at least one base URL such as {DEFAULT_URL}")
        for name in ("topk", "max_queries_per_request", "max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"retriever.{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"retriever.timeout_s must be > 0, got {self.timeout_s}")
        if (self.max_retries or 0) < 0 or min(self.retry_window_s, self.backoff_s, self.backoff_max_s) < 0:
            raise ValueError("retriever.retry_window_s, max_retries, backoff_s and backoff_max_s must be >= 0")

    @property
    def urls(self) -> list[str]:
        """The base URLs, without trailing ``/`` or ``/retrieve``."""
        out = []
        for raw in self.url.split(","):
            u = raw.strip().rstrip("/")
            if u.endswith("/retrieve"):
                u = u[: -len("/retrieve")]
            if u:
                out.append(u)
        return out

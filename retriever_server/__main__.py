"""``python -m retriever_server``: serve the retriever with uvicorn and the request deadline of ``http_guard``.

    python -m retriever_server                              # RETRIEVER_HOST:RETRIEVER_PORT, 127.0.0.1:8000
    python -m retriever_server --host 0.0.0.0 --port 8001   # other machines may call it (RETRIEVER_ALLOWED_HOSTS)

Plain ``uvicorn retriever_server.app:app`` serves the same app, but uvicorn never closes a connection whose headers
are only partly sent; this command does (``RETRIEVER_REQUEST_TIMEOUT_S``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import uvicorn

from retriever_server.settings import Settings


def main(argv: Sequence[str] | None = None) -> None:
    settings = Settings()  # not the cached get_settings(): --host must reach the app through the environment
    parser = argparse.ArgumentParser(prog="python -m retriever_server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=settings.host, help="bind address (default RETRIEVER_HOST)")
    parser.add_argument("--port", type=int, default=settings.port, help="port (default RETRIEVER_PORT)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes, each with its own index")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    os.environ["RETRIEVER_HOST"] = args.host  # the app accepts its bind host in the Host header
    uvicorn.run(
        "retriever_server.app:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        http="retriever_server.api.http_guard:DeadlineHttpToolsProtocol",
        log_level=args.log_level,
    )


if __name__ == "__main__":
    main()

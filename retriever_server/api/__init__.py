"""The HTTP API: the FastAPI app, its routes, request/response schemas, guards, limits, batching and errors."""

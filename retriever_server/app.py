"""The retriever service's ASGI entry: ``uvicorn retriever_server.app:app`` (the app is built in ``api/app.py``)."""

from retriever_server.api.app import app, create_app

__all__ = ["app", "create_app"]

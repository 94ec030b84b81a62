"""The web face of tuneplan (``tuneplan serve``): FastAPI pages and their JSON twins.

Needs the ``web`` extra (fastapi, uvicorn, jinja2, python-multipart). ``create_app`` builds
the app; nothing here computes — pages call the same functions as the CLI.
"""

from __future__ import annotations

from tuneplan.web.app import create_app

__all__ = ["create_app"]

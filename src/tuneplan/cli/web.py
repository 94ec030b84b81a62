"""``tuneplan serve``: run the web app (FastAPI, uvicorn) on 127.0.0.1 by default.

Thin: checks the web extra is installed and starts uvicorn; the app is ``tuneplan.web``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tuneplan.errors import InvalidValueError


def serve_command(
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind. The default serves this machine only; another "
                       "address exposes the app to your network (no authentication).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.", min=1, max=65_535)] = 8000,
    allow_hub: Annotated[bool, typer.Option(
        "--allow-hub", help="Fetch hub ids that are not cached locally from the Hugging Face "
                            "hub (size-checked, 10 s timeout, 4 at a time). Off: bundled and "
                            "cached models only, no network request.")] = False,
) -> None:
    """The web app: offers table, job planner with charts, JSON API (/api, /openapi.json)."""
    try:
        import uvicorn

        from tuneplan.web import create_app
    except ImportError as exc:
        raise InvalidValueError(
            f"the web app needs the web extra ({exc.name} is missing): "
            "pip install 'tuneplan[web]'") from exc
    typer.echo(f"tuneplan web app on http://{host}:{port}/ (Ctrl+C stops it)", err=True)
    hosts = sorted({host, "127.0.0.1", "localhost", "::1", "[::1]"})
    uvicorn.run(create_app(allow_hub=allow_hub, allowed_hosts=hosts), host=host, port=port,
                log_level="warning")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)

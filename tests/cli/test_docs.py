"""Docs cannot drift: every command and sub-command has help text and appears in the README."""

from __future__ import annotations

from pathlib import Path

import typer.main

from tuneplan.cli.app import app

README = (Path(__file__).parents[2] / "README.md").read_text("utf-8")


def _commands() -> list[tuple[str, str | None]]:
    """(``group command`` path, help) for every leaf command of the app."""
    root = typer.main.get_command(app)
    found: list[tuple[str, str | None]] = []

    def walk(command: object, prefix: str) -> None:
        children = getattr(command, "commands", None)
        if children:
            for name, child in children.items():
                walk(child, f"{prefix} {name}".strip())
        else:
            found.append((prefix, getattr(command, "help", None)))

    walk(root, "")
    return found


def test_the_app_has_the_commands_of_the_cli_contract() -> None:
    names = {path for path, _ in _commands()}
    contract = {"memory", "explain", "fit", "throughput", "gpus", "providers", "offers",
                "catalog status", "catalog refresh", "catalog import", "catalog history",
                "catalog remove",
                "cost", "plan", "launch", "probe", "serve", "models"}
    assert contract <= names


def test_every_command_has_help_and_a_readme_mention() -> None:
    missing_help = [path for path, text in _commands() if not (text or "").strip()]
    missing_readme = [path for path, _ in _commands() if f"tuneplan {path}" not in README]
    assert missing_help == []
    assert missing_readme == []

"""Entry point: ``python -m app <command>``."""

from app.cli import entry

entry()

"""The ``pgstore`` command: migrate, inspect and run a store's schema from a shell."""

from __future__ import annotations

from pgstore.cli.commands import main

__all__ = ["main"]

"""Acceptance rules (docs/design.md §3): pure tensor functions, no model calls, importing nothing but torch."""

from prove.decode.rules.base import Accept

__all__ = ["Accept"]

"""prove.decode — one cycle engine, proposers, verifiers, pure acceptance rules, CLI and bench.

``Decoder`` and ``GenerationResult`` are imported lazily, so ``import prove.decode`` (and the CLI's
``--help``) does not pay for torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.decode.decoder import Decoder, GenerationResult

__all__ = ["Decoder", "GenerationResult"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from prove.decode import decoder

        return getattr(decoder, name)
    raise AttributeError(f"module 'prove.decode' has no attribute {name!r}")

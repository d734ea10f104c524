"""Small data files shipped with the package, for tests and demos.

``dolci_sample.jsonl``: 50 hand-written chat rows in the Dolci schema (``id``, ``source``, ``messages``)
— single- and multi-turn, with system turns, tool turns, ``<think>`` reasoning, non-English text — and
four rows the validation step skips: a None content, an unknown role, a conversation ending on the
user, and an empty reply.
"""

from pathlib import Path

DOLCI_SAMPLE = Path(__file__).with_name("dolci_sample.jsonl")

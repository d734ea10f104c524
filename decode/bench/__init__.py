"""``prove-bench``: every method over one prompt set in one process, AR first as the reference.

A reader's map: :mod:`.config` (``BenchConfig``, every default) → :mod:`.rows` (which rows, transformers'
rows) → :mod:`.run` (``run_bench``: the steps in order) → :mod:`.metrics` (the pure numbers) →
:mod:`.report` (bench.json, bench.md) and :mod:`.plots`; :mod:`.hf_compare` is the ours-vs-transformers
mode, :mod:`.cli` the Hydra front door. Nothing here imports torch or transformers at import time.
"""

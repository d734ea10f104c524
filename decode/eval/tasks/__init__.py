"""lm-evaluation-harness task configs shipped with prove (pass this folder as ``--include_path``).

``prove_arith`` scores the generated arithmetic word problems of the tiny recipe (``prove.data.synthetic``):
greedy generation, then exact match of the number after "The answer is". :data:`TASKS_DIR` is the folder
to hand to lm-eval; ``docs/eval.md`` says how to point it (and the six benchmarks) at local files.
"""

from __future__ import annotations

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
"""The folder holding the task YAML files: lm-eval's ``--include_path`` / ``TaskManager(include_path=...)``."""

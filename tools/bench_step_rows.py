"""The rows ``tools/bench_mars_step.py`` steps on: synthetic chat-shaped ones, or a JSONL file's, each
``{input_ids, labels}`` with −100 on the prompt (kept apart so the benchmark reads as variants, rows and report)."""

from __future__ import annotations

import json
import random
from pathlib import Path

IGNORE_INDEX = -100  # prove.data.chat.IGNORE_INDEX, without importing it before --help


def synthetic_rows(
    n: int, prompt_len: int, answer_len: int, jitter: float, n_tokens: int, mask_id: int, eos_id: int,
    max_len: int, seed: int = 0,
) -> list[dict[str, list[int]]]:  # fmt: skip
    """``n`` chat-shaped rows ``{input_ids, labels}``: a prompt then an answer, each ``round(len · U(1 ± jitter))``
    random ids in ``[3, n_tokens)`` other than ``mask_id``, the answer's last token EOS (the end of the turn), labels
    −100 on the prompt, the row cut at ``max_len`` (a prompt that long is cut to leave one answer token)."""
    rng = random.Random(seed)

    def length(mean: int) -> int:
        return max(1, round(mean * rng.uniform(1 - jitter, 1 + jitter)))

    def ids(k: int) -> list[int]:
        return [t if t != mask_id else 3 for t in (rng.randrange(3, n_tokens) for _ in range(k))]

    rows = []
    for _ in range(n):
        prompt = ids(min(length(prompt_len), max_len - 1))
        answer = (ids(length(answer_len) - 1) + [eos_id])[: max_len - len(prompt)]
        rows.append({"input_ids": prompt + answer, "labels": [IGNORE_INDEX] * len(prompt) + answer})
    return rows


def file_rows(path: Path, n: int, max_len: int) -> list[dict[str, list[int]]]:
    """``n`` rows from a JSONL file of ``{prompt_ids, answer_ids}`` or ``{input_ids, labels}`` (cycled when it holds
    fewer), cut at ``max_len`` as ``prove.data.build`` cuts them."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "prompt_ids" in rec:
            ids = list(rec["prompt_ids"]) + list(rec["answer_ids"])
            labels = [IGNORE_INDEX] * len(rec["prompt_ids"]) + list(rec["answer_ids"])
        elif "input_ids" in rec:
            ids, labels = list(rec["input_ids"]), list(rec["labels"])
        else:
            raise ValueError(f"{path}: a row needs prompt_ids + answer_ids, or input_ids + labels")
        if any(t != IGNORE_INDEX for t in labels[:max_len]):
            rows.append({"input_ids": ids[:max_len], "labels": labels[:max_len]})
    if not rows:
        raise ValueError(f"{path}: no row with an answer token within max_len={max_len}")
    return [rows[i % len(rows)] for i in range(n)]

"""Rows per second of the training set's tokenization (``prove.data.build.build_tokenized_dataset``: the chat
template rendered twice a row — the whole conversation and the prompt — and both encoded), on a synthetic set in
Dolci's schema, and the time that puts on Dolci's ~2.15M rows (docs/training.md, "Tokenisation").

    .venv/bin/python tools/bench_tokenize.py                          # 200,000 rows, one process (make bench-tokenize)
    .venv/bin/python tools/bench_tokenize.py --rows 20000 --num-proc 2

The rows: ``{id, messages, source}`` with ``messages = [{role, content, function_calls, functions}]``, a quarter of
them two user/assistant exchanges, 10–110-word prompts and 60–340-word replies of generated words (≈ 500 tokens a row
before truncation at ``--max-len``, about Dolci's). The tokenizer: a byte-level BPE with Qwen2's normaliser and
pre-tokeniser and the ChatML template (``prove.data.tokenizer.train_chatml_bpe``), trained here on a sample — no
hub access; Qwen2.5's own has a larger vocabulary but the same pipeline. A benchmark, not a test: the time depends
on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

DOLCI_ROWS = 2_150_000
SYLLABLES = [a + b for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ai", "ou", "ea")]


def _words(rng: random.Random, n: int) -> str:
    out = []
    for i in range(n):
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 1, 2, 2, 3))))
        if rng.random() < 0.04:
            w = str(rng.randint(0, 9999))
        out.append(w + ("." if rng.random() < 0.08 else ("," if rng.random() < 0.06 else "")))
        if i and rng.random() < 0.01:
            out.append("\n\n")
    return " ".join(out)


def _turn(role: str, content: str) -> dict:
    return {"role": role, "content": content, "function_calls": None, "functions": None}


def write_rows(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            messages = []
            for _ in range(2 if rng.random() < 0.25 else 1):
                messages.append(_turn("user", _words(rng, rng.randint(10, 110))))
                messages.append(_turn("assistant", _words(rng, rng.randint(60, 340))))
            f.write(json.dumps({"id": f"synthetic-{i}", "messages": messages, "source": "synthetic"}) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/bench_tokenize.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--num-proc", type=int, default=1, help="datasets.map worker processes (data.num_proc)")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=16_000)
    p.add_argument("--out", default="outputs/bench-tokenize", help="the rows, the tokenizer and result.json")
    args = p.parse_args(argv)

    from prove.data.build import build_tokenized_dataset
    from prove.data.conversations import load_chat_dataset
    from prove.data.tokenizer import train_chatml_bpe

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = out / f"rows-{args.rows}.jsonl"
    if not rows.is_file():
        t0 = time.perf_counter()
        write_rows(rows, args.rows)
        print(f"wrote {args.rows} rows to {rows} in {time.perf_counter() - t0:.0f} s", flush=True)
    dataset = load_chat_dataset(str(rows))
    sample = (m["content"] for r in dataset.select(range(min(5000, len(dataset)))) for m in r["messages"])
    tokenizer = train_chatml_bpe(sample, vocab_size=args.vocab_size, with_mask=False)
    t0 = time.perf_counter()
    tokenized, report = build_tokenized_dataset(
        dataset, tokenizer, args.max_len, num_proc=args.num_proc, load_from_cache_file=False
    )
    seconds = time.perf_counter() - t0
    rate = len(dataset) / seconds
    tokens = sum(len(x) for x in tokenized["input_ids"]) / max(1, len(tokenized))
    result = {
        "rows": len(dataset),
        "num_proc": args.num_proc,
        "seconds": round(seconds, 1),
        "rows_per_s": round(rate, 1),
        "tokens_per_row_kept": round(tokens, 1),
        "report": str(report),
        "dolci_rows": DOLCI_ROWS,
        "dolci_minutes_estimate": round(DOLCI_ROWS / rate / 60, 1),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

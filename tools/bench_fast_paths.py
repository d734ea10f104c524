"""One checkpoint's methods on our engine's three ways of running a cycle, in one process: the composed cycle
(``fast=false``, the path named ``reference``), the device cycle (``fast=true``, ``fast``: the rule's twin, a
fixed-width cycle) and the device cycle compiled (``fast=true compile=true``, ``compiled``: the cycle through
inductor); all on the slot cache. Tokens/s over the same prompts, the fastest of
``--repeats`` passes over them, and whether each row's tokens equal the first row's (exit 1 if not).

    .venv/bin/python tools/bench_fast_paths.py --model runs/smollm2-r5/round-5/mars \\
        --prompts runs/data/smollm2-mix/test.jsonl --chat

The fast rows get the Decoder's default cache (min(max_position_embeddings, 4096) slots, grown as needed), or
``--cache-len`` slots fixed; a pass attends the slots in use either way. The first prompt is a warm-up (and the compile) and is not timed. A benchmark, not a
test: the times depend on the machine and its load; run it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

PATHS = {
    "reference": {"fast": False},
    "fast": {"fast": True},
    "compiled": {"fast": True, "compile": True},
}


def measure(
    build: Callable[..., Any],
    prompts: Sequence[Any],
    *,
    methods: Sequence[str],
    paths: Sequence[str],
    cache_len: int | None,
    max_new_tokens: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """One row per method × path: ``build(method=..., **path kwargs)`` gives the Decoder; ``prompts[0]`` warms it."""
    rows: list[dict[str, Any]] = []
    for method in methods:
        ref: list[list[int]] | None = None
        for path in paths:
            kw = dict(PATHS[path], method=method)
            if kw["fast"] and cache_len:
                kw["cache_len"] = cache_len
            t0 = time.perf_counter()
            dec = build(**kw)
            dec.generate(prompts[0], max_new_tokens=min(32, max_new_tokens))
            warm = time.perf_counter() - t0
            best, outs = 0.0, []
            for _ in range(repeats):
                spent, n, outs = 0.0, 0, []
                for p in prompts[1:]:
                    s = time.perf_counter()
                    out = dec.generate(p, max_new_tokens=max_new_tokens)
                    spent += time.perf_counter() - s
                    n += len(out.token_ids)
                    outs.append(out)
                best = max(best, n / spent)
            fast = outs[-1].stats.fast
            tokens = [o.token_ids for o in outs]
            ref = tokens if ref is None else ref
            rows.append(
                {
                    "method": method,
                    "path": path,
                    "ran": "reference" if fast is None else "fast, compiled" if fast["compiled"] else "fast",
                    "tok_s": best,
                    "tokens_per_cycle": sum(len(t) for t in tokens) / sum(o.stats.cycles for o in outs),
                    "warmup_s": warm,
                    "same_as_first_row": tokens == ref,
                }
            )
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| method | path | tok/s | × first row | tok/cycle | warm-up s | = first row |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    first: dict[str, float] = {}
    for r in rows:
        base = first.setdefault(r["method"], r["tok_s"])
        lines.append(
            f"| {r['method']} | {r['ran']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}× | {r['tokens_per_cycle']:.2f} | "
            f"{r['warmup_s']:.1f} | {'yes' if r['same_as_first_row'] else '**no**'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a checkpoint directory (its tokenizer beside it)")
    ap.add_argument("--prompts", required=True, help="JSONL or text prompts (prove-bench's format)")
    ap.add_argument(
        "--n", type=int, default=6, help="prompts read: the first warms up, the rest are timed (6)"
    )
    ap.add_argument("--methods", default="ar,prove-lossless")
    ap.add_argument("--paths", default="reference,fast,compiled", help=f"of {','.join(PATHS)}")
    ap.add_argument(
        "--cache-len",
        type=int,
        default=0,
        help="the fast rows' KV slots, fixed (0: the Decoder's default, grown)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="passes over the prompts; the fastest counts (2)")
    ap.add_argument("--chat", action="store_true", help="wrap raw prompts in the chat template")
    args = ap.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths or args.n < 2:
        ap.error(
            f"--paths takes {', '.join(PATHS)} (got {bad or 'none'}); --n needs ≥ 2 (a warm-up and a timed one)"
        )

    from prove.data.prompts import read_prompts, render
    from prove.decode import Decoder

    texts = [render(r, args.chat) for r in read_prompts(args.prompts)[: args.n]]
    if len(texts) < 2:
        ap.error(f"{args.prompts} holds {len(texts)} prompt(s): give at least 2")

    def build(**kw: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Decoder.from_pretrained(args.model, **kw)

    rows = measure(
        build,
        texts,
        methods=[m for m in args.methods.split(",") if m],
        paths=paths,
        cache_len=args.cache_len,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
    )
    for r in rows:
        print(json.dumps(r))
    print(table(rows))
    return 0 if all(r["same_as_first_row"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

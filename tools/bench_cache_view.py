"""What the fast path's cache size costs a pass: greedy AR on one checkpoint from a prompt of ``--context`` tokens,
the Decoder's default cache (min(max_position_embeddings, 4096) slots, grown as needed) against one of
``--cache-len`` slots. A pass attends the slots in use rounded up to a power of two (``SlotCache.view``), so the two
should cost the same; before views, every pass attended every allocated slot.

    .venv/bin/python tools/bench_cache_view.py --model CKPT --cache default
    .venv/bin/python tools/bench_cache_view.py --model CKPT --cache 512

Prints one JSON line (ms a token over the timed tokens, the tokens, the cache's capacity and the last view). Run it
twice in alternation under an outside timer for a whole-process ratio. A benchmark, not a test: run it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a checkpoint directory (its tokenizer beside it)")
    ap.add_argument("--cache", default="default", help="'default' or a fixed number of slots")
    ap.add_argument("--context", type=int, default=256, help="prompt tokens (256)")
    ap.add_argument("--new", type=int, default=128, help="new tokens timed (128)")
    args = ap.parse_args(argv)

    import torch
    from prove.decode import Decoder

    torch.manual_seed(0)
    kw = {} if args.cache == "default" else {"cache_len": int(args.cache)}
    dec = Decoder.from_pretrained(args.model, method="ar", fast=True, **kw)
    vocab = dec.model.config.vocab_size
    prompt = torch.randint(
        100, min(vocab, 30000), (args.context,), generator=torch.Generator().manual_seed(0)
    )
    ids = prompt.tolist()
    dec.generate(ids[:32], max_new_tokens=8, eos_token_id=[])  # warm-up
    t0 = time.perf_counter()
    out = dec.generate(ids, max_new_tokens=args.new, eos_token_id=[])
    spent = time.perf_counter() - t0
    engine = dec.fast_engine
    row = {
        "cache": args.cache,
        "capacity": engine.capacity,
        "view": engine.cache.view,
        "context": args.context,
        "new_tokens": len(out.token_ids),
        "ms_per_token": 1000 * spent / len(out.token_ids),
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

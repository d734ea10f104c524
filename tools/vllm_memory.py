"""What a vLLM engine of each method holds once it is up: the resident memory of vLLM's processes (this one and its
engine-core and worker children), beside prove's memory plan of the engine.

    python tools/vllm_memory.py --model runs/smollm2-135m/mars --verifier runs/smollm2-135m/verifier-distill \\
        --methods prove-lossless prove --kv-cache-gb 0.5

One engine at a time, each with the same explicit KV cache (``--kv-cache-gb``), so what differs between methods is
the weights: vLLM ``prove-lossless`` loads the MARS checkpoint twice (its target and its own parallel drafter), vLLM
``prove`` once (the drafter) beside the small verifier (the target). A benchmark, not a test: run it idle, and read
the difference between rows, not the rows alone (each includes vLLM's own ~2 GB of processes). Writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def tree_rss_gib() -> float:
    """Resident memory of this process and every descendant, GiB (shared pages counted once per process)."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**30


def measure(
    model: str, method: str, verifier: str | None, kv_cache_gb: float, max_model_len: int, settle_s: float
) -> dict:
    from prove.decode.config import VllmOptions
    from prove.decode.vllm.backend import VllmDecoder

    before = tree_rss_gib()
    t0 = time.perf_counter()
    dec = VllmDecoder(
        model,
        method=method,
        verifier=verifier if method == "prove" else None,
        options=VllmOptions(kv_cache_gb=kv_cache_gb, max_model_len=max_model_len),
    )
    try:
        startup = time.perf_counter() - t0
        dict(dec.generate_many([dec.encode("Hello")], 8))  # one request: every process has run a step
        time.sleep(settle_s)
        up = tree_rss_gib()
        plan = dec.memory_plan
    finally:
        dec.close()
    return {
        "method": method,
        "startup_s": round(startup, 1),
        "rss_gib": round(up, 3),
        "rss_before_gib": round(before, 3),
        "plan": str(plan),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/vllm_memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the MARS checkpoint")
    p.add_argument("--verifier", default=None, help="ProVe's small verifier (needed by method prove)")
    p.add_argument("--methods", nargs="+", default=["prove-lossless", "prove"])
    p.add_argument("--kv-cache-gb", type=float, default=0.5)
    p.add_argument(
        "--max-model-len", type=int, default=1024, help="tokens a sequence may hold (sizes the KV check)"
    )
    p.add_argument("--settle-s", type=float, default=2.0, help="wait after the first request before reading")
    p.add_argument("--out", default="outputs/vllm-memory/result.json")
    args = p.parse_args(argv)
    if "prove" in args.methods and args.verifier is None:
        raise SystemExit("method prove needs --verifier <the small verifier's folder>")
    rows = [
        measure(args.model, m, args.verifier, args.kv_cache_gb, args.max_model_len, args.settle_s)
        for m in args.methods
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"model": args.model, "verifier": args.verifier, "rows": rows}, indent=2) + "\n"
    )
    print("| method | resident, vLLM's processes | prove's plan |\n|---|---:|---|")
    for r in rows:
        print(f"| {r['method']} | {r['rss_gib']:.2f} GiB | {r['plan']} |")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

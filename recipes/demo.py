"""``make demo``: the tiny default end to end on CPU (docs/design.md §5), then ``prove-bench`` on held-out prompts.

    python -m prove.recipes.demo                         # what `make demo` runs: runs/tiny/*, outputs/demo/
    python -m prove.recipes.demo --n-prompts 100 --repeats 5
    python -m prove.recipes.demo --smoke --run-dir /tmp/demo/runs --data /tmp/demo/data/train.jsonl \\
        --out /tmp/demo/bench                           # a few steps of each stage: the test suite's smoke run

The pipeline (recipes/tiny.yaml): the generated arithmetic task (``prove.data.synthetic``, written on first
use), proposer SFT → MARS (K = 8), a 2-layer verifier SFT'd from scratch → distilled on the proposer's
outputs, then every method over the held-out prompts: ar, mars, prove (a θ sweep), prove-lossless (unfused
and fused, one model pass a cycle), and the
speculative-decoding family (sd, nsd, asd) with the tiny verifier as the draft, beside transformers' own
greedy and assisted generation. With vLLM installed, vLLM's ar, prove-lossless, sd and prove at θ = 0.1 (the MARS
model drafting for the verifier, our rule in vLLM's step; our rows sweep θ) run in the same bench with 1 and 8
requests in flight (``prove-bench backend=vllm``, docs/vllm.md; ``make bench`` sweeps 1..64 and every θ of its sweep);
``--no-vllm`` (and ``--smoke``) leave them out.

Every stage runs through the ``prove-train`` CLI in a subprocess (``prove.decode`` never imports ``prove.train``,
docs/design.md §3.2), which skips a stage whose folder holds a finished ``prove.json`` of the same config — one
rule for the demo and every other launch (``prove.train.rerun``): a rerun goes straight to the bench, a changed
``--train-arg`` trains the stages it changes, a stage its wall-time cap cut short resumes, ``--train-arg
force=true`` retrains them all.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prove.common.checkpoint import read_prove_json

RECIPE = "tiny"
METHODS = ("ar", "mars", "prove", "prove-lossless", "sd", "nsd", "asd")
THETAS = (0.02, 0.05, 0.1, 0.2, 0.4)
VLLM_THETAS = (0.1,)
"""θ of the demo's vLLM prove row (ProVe's headline θ; one engine would serve every θ of ``THETAS``, at a sweep's
time each)."""
DEMO_CONCURRENCY = (1, 8)
"""Requests in flight of the demo's vLLM rows (the full sweep is ``make bench``'s)."""
FUSE_GROUPS = ("all", 1, 2, "auto")
"""prove-lossless runs unfused and fused (``prove.decode.engine.fused``) with these J settings, side by side."""
DRAFT_THRESHOLDS = (0.0, 0.4)
"""sd runs with a draft of k tokens and with drafting stopped under p = 0.4 (transformers' default cut-off)."""


def pass_cost_widths(mars_dir: Path) -> int:
    """The bench's pass-cost curve runs up to the widest fused pass of the trained block size (79 at K = 8)."""
    from prove.decode.engine.fused import widest_tree

    meta = read_prove_json(mars_dir)
    return widest_tree(meta.block_size if meta is not None and meta.block_size else 8)


@dataclass(frozen=True)
class Stage:
    title: str
    dir: str
    """The stage's output folder under the run dir (recipes/tiny.yaml: ``stages.<role>.<stage>.dir``)."""
    overrides: tuple[str, ...]


STAGES = (
    Stage("proposer SFT", "sft", ("stage=sft",)),
    Stage("proposer MARS block training", "mars", ("stage=mars",)),
    Stage("verifier SFT", "verifier-sft", ("stage=sft", "stage.role=verifier")),
    Stage("verifier distillation on the proposer's outputs", "verifier-distill", ("stage=distill",)),
)

SMOKE_TRAIN = (
    "stages.proposer.layers=2", "stages.verifier.layers=1", "model.scratch.hidden=32", "model.scratch.heads=2",
    "model.scratch.kv_heads=2", "model.scratch.intermediate=64", "model.scratch.vocab_size=300",
    "model.scratch.tokenizer_rows=256", "data.synthetic.n=400", "data.synthetic.test_size=8", "max_len=128",
    "stages.proposer.sft.max_steps=4", "stages.proposer.mars.max_steps=4", "stages.verifier.sft.max_steps=4",
    "stages.verifier.distill.max_steps=4", "distill.num_prompts=4", "distill.max_new_tokens=16",
    "trainer.per_device_train_batch_size=8", "trainer.save_steps=1000", "trainer.logging_steps=1",
)  # fmt: skip
"""A few steps of each stage on a 2-layer, hidden-32 model: the plumbing only (the test suite's smoke run)."""


def train_command(stage: Stage, run_dir: Path, data: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "prove.train.cli", f"recipe={RECIPE}", f"run_dir={run_dir}", f"data.path={data}",
        *stage.overrides, *extra,
    ]  # fmt: skip


def _say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m prove.recipes.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default=f"runs/{RECIPE}", help="checkpoints: <run-dir>/{sft,mars,verifier-*}")
    p.add_argument(
        "--data", default="runs/data/arithmetic/train.jsonl", help="training rows (test.jsonl beside)"
    )
    p.add_argument("--out", default="outputs/demo", help="bench.json, bench.md and the plots")
    p.add_argument("--n-prompts", type=int, default=30, help="held-out prompts to bench")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--repeats", type=int, default=3, help="timed decodes per prompt and method; the fastest counts"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--smoke", action="store_true", help="a few steps per stage, 2 prompts: checks the plumbing"
    )
    p.add_argument("--train-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra prove-train override for every stage (repeatable)")  # fmt: skip
    p.add_argument("--no-vllm", action="store_true", help="no vLLM rows, even with vLLM installed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir, data, out = Path(args.run_dir), Path(args.data), Path(args.out)
    t_start = time.perf_counter()
    train_stages(run_dir, data, [*(SMOKE_TRAIN if args.smoke else ()), *args.train_arg])
    from prove.decode.bench.run import run_bench

    cfg = bench_config(args, bench_methods())
    _say(f"bench: {', '.join(cfg.methods)} on {cfg.n_prompts} held-out prompts\n$ {bench_command_line(cfg)}")
    report = run_bench(cfg)
    print()
    print((out / "bench.md").read_text())
    print(f"bench.json: {out / 'bench.json'}")
    for name, path in report["plots"].items():
        print(f"plot {name}: {path}")
    print(f"\ndemo done in {(time.perf_counter() - t_start) / 60:.1f} min")
    return 0


def train_stages(run_dir: Path, data: Path, extra: list[str]) -> None:
    """Proposer sft → mars, verifier sft → distill, each through prove-train in a subprocess (which skips a
    finished stage of the same config)."""
    for stage in STAGES:
        cmd = train_command(stage, run_dir, data, extra)
        _say(f"{stage.title} -> {run_dir / stage.dir}\n$ prove-train {shlex.join(cmd[3:])}")
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        print(f"   {stage.title}: {time.perf_counter() - t0:.0f} s", flush=True)


def bench_methods() -> list[str]:
    """The demo's methods that ``prove.decode.methods`` registers (a note names those it does not)."""
    from prove.decode.methods import METHODS as REGISTERED

    methods = [m for m in METHODS if m in REGISTERED]
    missing = sorted(set(METHODS) - set(methods))
    if missing:
        print(f"note: method(s) {missing} are not registered in prove.decode.methods; benching without them")
    return methods


def method_params(methods: list[str]) -> dict[str, dict[str, list]]:
    """The sweeps of our rows: prove over ``THETAS``, prove-lossless unfused and fused by ``FUSE_GROUPS``, sd by
    ``DRAFT_THRESHOLDS``."""
    params: dict[str, dict[str, list]] = {}
    if "prove" in methods:
        params["prove"] = {"theta": list(THETAS)}
    if "prove-lossless" in methods:
        params["prove-lossless"] = {"fuse": [False, True], "fuse_groups": list(FUSE_GROUPS)}
    if "sd" in methods:
        params["sd"] = {"draft_threshold": list(DRAFT_THRESHOLDS)}
    return params


def bench_config(args: argparse.Namespace, methods: list[str]) -> Any:
    """The bench of the trained MARS model on the held-out prompts (test.jsonl beside the training rows), the
    distilled verifier as prove's verifier and the draft; vLLM's rows where vLLM is installed and the run is no
    smoke run (its head size of 16 is below what vLLM's CPU attention takes, 32)."""
    import importlib.util

    from prove.decode.bench.config import BenchConfig
    from prove.decode.config import VllmOptions

    run_dir, data = Path(args.run_dir), Path(args.data)
    verifier = str(run_dir / STAGES[-1].dir)
    n_prompts = 2 if args.smoke else args.n_prompts
    with_vllm = not (args.no_vllm or args.smoke) and importlib.util.find_spec("vllm") is not None
    return BenchConfig(
        model=str(run_dir / "mars"),
        verifier=verifier,
        draft=verifier,
        prompts=str(data.parent / "test.jsonl"),
        methods=methods,
        method_params=method_params(methods),
        n_prompts=n_prompts,
        max_new_tokens=24 if args.smoke else args.max_new_tokens,
        repeats=1 if args.smoke else args.repeats,
        pass_cost_widths=8 if args.smoke else pass_cost_widths(run_dir / "mars"),
        output_dir=str(Path(args.out)),
        device=args.device,
        backend="vllm" if with_vllm else "engine",
        # a short sweep here (the first command a new user runs); make bench / prove-bench sweep 1..64
        vllm_concurrency=[c for c in DEMO_CONCURRENCY if c <= n_prompts],
        vllm_method_params={"prove": {"theta": list(VLLM_THETAS)}} if with_vllm else None,
        vllm_methods=[
            "ar",
            "prove-lossless",
            "sd",
            "prove",
        ],  # prove: the MARS model drafting for the verifier
        # four engines at once: 0.5 GiB of KV cache each
        vllm=VllmOptions(kv_cache_gb=0.5, max_model_len=1024),
    )


def bench_command_line(cfg: Any) -> str:
    """The ``prove-bench`` command that runs ``cfg`` (printed, so the bench can be rerun by hand)."""
    sweep = ",".join(f"{t:g}" for t in THETAS)
    groups = ",".join(map(str, FUSE_GROUPS))
    cuts = ",".join(f"{t:g}" for t in DRAFT_THRESHOLDS)
    line = (
        f"prove-bench model={cfg.model} verifier={cfg.verifier} draft={cfg.draft} prompts={cfg.prompts} "
        f"methods=[{','.join(cfg.methods)}] "
        f"'method_params={{prove:{{theta:[{sweep}]}},prove-lossless:{{fuse:[false,true],fuse_groups:[{groups}]}},"
        f"sd:{{draft_threshold:[{cuts}]}}}}' "
        f"n_prompts={cfg.n_prompts} max_new_tokens={cfg.max_new_tokens} repeats={cfg.repeats} "
        f"pass_cost_widths={cfg.pass_cost_widths} output_dir={cfg.output_dir}"
    )
    if cfg.backend != "vllm":
        return line
    return line + (
        f" backend=vllm 'vllm_methods=[ar,prove-lossless,sd,prove]' "
        f"'vllm_method_params={{prove:{{theta:[{','.join(f'{t:g}' for t in VLLM_THETAS)}]}}}}' "
        f"vllm_concurrency=[{','.join(map(str, cfg.vllm_concurrency))}] vllm.kv_cache_gb=0.5 "
        "vllm.max_model_len=1024"
    )


if __name__ == "__main__":
    sys.exit(main())

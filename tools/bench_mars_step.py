"""Seconds per step and peak RSS of a MARS training step against a plain causal-LM step on the same rows (issue 30's
≤ 1.3× target), at SmolLM2-135M's shape and the settings of ``recipes/smollm2-135m.yaml``.

    .venv/bin/python tools/bench_mars_step.py                      # make bench-step: SmolLM2's shape, random weights
    .venv/bin/python tools/bench_mars_step.py --steps 5 --repeats 3 trainer.per_device_train_batch_size=8
    .venv/bin/python tools/bench_mars_step.py --model <HF folder or .gguf> --rows rows.jsonl
    .venv/bin/python tools/bench_mars_step.py --tiny               # 2 layers, hidden 64: checks that it runs

Three variants, each one optimizer step (forward, loss, backward, gradient clipping, AdamW over the trainable
parameters) on the same batches and the same initial weights:

- ``plain``: ``model(input_ids, attention_mask, labels)``, transformers' own causal-LM loss on the answer (the rows
  as stage sft collates them, no block padding);
- ``mars``: the trainer's step (``MarsTrainer.compute_loss``) without a Trainer, the same
  ``prove.train.mars_step.MarsStep``: ``trimmed_inputs`` (the noisy blocks from (P − 1) // K on), the attention ``stage.attention`` picks
  (``mars_attention_impl``: by default the block attention of ``prove.train.attention`` under sdpa) and its
  ``trimmed_attention_mask``, ``final_hidden`` (the input embedding from ``target_embedding``), then the head
  (``target_head``: the ``<|mask|>`` row's gradient its own row's) and the cross-entropy at the targets only
  (``head_cross_entropy``, ``stage.ce_chunk_rows`` at a time) and ``mars_loss_terms`` (with ``stage.depth_decay``'s weights where set); the mask is built every step (the trainer caches it by the batch's layout, which rows of
  other lengths seldom repeat);
- ``mars-full``: the reference, the whole 2L input ``[noisy | clean]`` with ``(B, 2L, V)`` logits
  (``block_inputs``, ``mars_attention_mask``, ``mars_loss``: MARS's uniform noisy loss, whatever
  ``stage.depth_decay`` says).

The settings are the recipe's, composed as ``prove-train recipe=smollm2-135m stage=mars`` composes them (LoRA r 32,
alpha 64 on every projection with the trainable ``<|mask|>`` row, micro-batch 4, K = 8, fp32, sdpa, max_len 256,
lr, weight decay, gradient clipping, ``ce_chunk_rows``, ``ar_weight``, ``depth_decay``); trailing ``key=value`` arguments override
them like prove-train's. The model: a randomly initialised Llama of SmolLM2-135M's shape (30 layers, hidden 576,
9 heads, 3 KV heads, MLP 1536, vocabulary 49,153 with the ``<|mask|>`` row, tied embeddings), built in-process —
nothing downloaded — or ``--model`` (its tokenizer gains ``<|mask|>`` as stage mars adds it). The rows: synthetic
chat-shaped ones (``--prompt-len`` / ``--answer-len`` tokens ± ``--jitter``, random ids, the answer ending on EOS,
cut at max_len), or ``--rows``, a JSONL file of ``{"prompt_ids", "answer_ids"}`` (or ``{"input_ids", "labels"}``).

``--profile`` adds a step after the timed ones, run under ``torch.profiler``, and splits its operators'
own CPU time four ways (:func:`breakdown`): the decoder's matrix products, attention, the vocabulary-sized work (the
head, its cross-entropy, and the full-vocabulary weight PEFT's trainable ``<|mask|>`` row merges and differentiates)
and the rest — where a MARS step's extra time over the plain one goes (a second table).

Each variant runs in a process of its own (so ``getrusage``'s peak RSS is that variant's), ``--warmup`` steps then
``--steps`` timed ones (the median is its s/step); ``--repeats`` (default 3) runs every variant again, the order
reversed every other repeat. The statistic is the median over repeats of each repeat's own MARS / plain ratio (the
plain step moves by ±12% with its place in the order, so a ratio is taken within one machine state), reported with
MARS's s/step (the median over repeats), so that a slower plain step cannot pass for a faster MARS one. Each record
also keeps the process's CPU seconds a step (``median_cpu_s``; with one thread, steadier than wall time on a shared
machine, but not the number the target is read on). Threads: as ``OMP_NUM_THREADS`` says (recorded).
-> ``--out``/result.json, a Markdown table on stdout. A benchmark, not a test: measure on an idle machine
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# run as a script, tools/ is on the path; loaded by file (its tests), it is not: its sibling modules need it
if (_TOOLS := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _TOOLS)

from bench_step_report import PROFILE_KINDS as PROFILE_KINDS  # noqa: E402 - re-exported (its tests)
from bench_step_report import breakdown, profiled, provenance, summarise, table  # noqa: E402 - after the path
from bench_step_report import headline as headline  # noqa: E402 - re-exported (its tests)
from bench_step_rows import IGNORE_INDEX, file_rows, synthetic_rows  # noqa: E402

VARIANTS = ("plain", "mars", "mars-full")
RANDOM_SOURCE = "random"


@dataclass(frozen=True)
class Shape:
    """A random Llama's architecture (``--model`` unset)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    """Embedding rows, the ``<|mask|>`` row (the last) included."""
    init_std: float
    """``initializer_range``: SmolLM2's own; the tiny model's larger, so that losses differ from row to row."""


SMOLLM2_135M = Shape(
    layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49_153, init_std=0.0417
)
TINY = Shape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=300, init_std=0.2)
BOS_ID, EOS_ID = 1, 2  # SmolLM2's <|im_start|> and <|im_end|> (its EOS and pad token)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="tools/bench_mars_step.py",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", help="prove-train overrides of the recipe, e.g. block_size=16")
    p.add_argument("--recipe", default="smollm2-135m", help="the recipe whose stage mars settings are used")
    p.add_argument("--model", default=None, help="a model folder, hub id or .gguf file, not random weights")
    p.add_argument("--layers", type=int, default=None, help="keep this many decoder layers (any model)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 random Llama; 1 + 1 steps")
    p.add_argument("--rows", type=Path, default=None, help="JSONL of {prompt_ids, answer_ids}, not synthetic")
    p.add_argument("--prompt-len", type=int, default=160, help="synthetic rows: mean prompt tokens")
    p.add_argument(
        "--answer-len", type=int, default=90, help="synthetic rows: mean answer tokens (EOS included)"
    )
    p.add_argument(
        "--jitter", type=float, default=0.1, help="synthetic rows: lengths drawn within ± this fraction"
    )
    p.add_argument("--seed", type=int, default=0, help="the rows' seed (the weights': trainer.seed)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 1)")
    p.add_argument(
        "--steps", type=int, default=None, help="timed steps, their median reported (default 3; --tiny 1)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="runs of every variant, in alternating order (the ratio: ≥ 3)"
    )
    p.add_argument(
        "--order",
        default=",".join(VARIANTS),
        help="the variants, in the first repeat's order (reversed every other repeat)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the variants in this process, one after another (no per-variant peak RSS; for tests)",
    )
    p.add_argument(
        "--profile", action="store_true", help="one more step, profiled: its CPU time by kind of operator"
    )
    p.add_argument("--out", type=Path, default=Path("outputs/bench-step"), help="result.json goes here")
    p.add_argument("--worker", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_intermixed_args(argv)
    args.order = [v.strip() for v in args.order.split(",") if v.strip()]
    unknown = sorted(set(args.order) - set(VARIANTS))
    if unknown or not args.order or len(set(args.order)) != len(args.order):
        p.error(f"--order {','.join(args.order)}: name each of {', '.join(VARIANTS)} at most once")
    args.warmup = 1 if args.warmup is None else args.warmup
    args.steps = (1 if args.tiny else 3) if args.steps is None else args.steps
    if args.steps < 1 or args.warmup < 0 or args.repeats < 1:
        p.error("--steps and --repeats must be ≥ 1, --warmup ≥ 0")
    if args.rows is None and (args.prompt_len < 1 or args.answer_len < 1 or not 0 <= args.jitter < 1):
        p.error("--prompt-len and --answer-len must be ≥ 1 and --jitter in [0, 1)")
    return args


# -- one variant's steps (in its own process) ---------------------------------------------------------------------


def load_config(args: argparse.Namespace) -> Any:
    """The recipe's stage mars config, composed as prove-train composes it, with ``args.overrides``."""
    import prove.train.cli  # noqa: F401 - registers the schema and the recipes
    from hydra import compose, initialize_config_module
    from prove.train.cli import to_config

    # a stand-in name keeps the recipe's own model path (a package file) unresolved; nothing loads it
    source = args.model or RANDOM_SOURCE
    fixed = [f"recipe={args.recipe}", "stage=mars", f"model.name_or_path={source}", "logger=none"]
    with initialize_config_module(config_module="prove.conf", version_base="1.3"):
        return to_config(compose(config_name="train", overrides=[*fixed, *args.overrides]))


@dataclass
class Built:
    """A variant's model (LoRA applied as the pipeline applies it) and what the rows need of its vocabulary."""

    model: Any
    mask_id: int
    eos_id: int
    pad_id: int
    n_tokens: int
    """Ids below this are tokens (synthetic rows draw from them)."""
    shape: dict[str, Any]


def build(args: argparse.Namespace, cfg: Any) -> Built:
    """The model every variant starts from, seeded by ``trainer.seed``: a random Llama of ``--tiny``'s or SmolLM2's
    shape, or ``--model`` with ``<|mask|>`` added (``prove.train.modeling.ensure_mask_token``); then LoRA
    (``prove.train.modeling.apply_lora``) when the recipe's ``peft.kind`` is lora."""
    import torch
    from prove.data.loading import load_model, load_tokenizer, torch_dtype
    from prove.train.config import PeftKind
    from prove.train.modeling import apply_lora, ensure_mask_token

    torch.manual_seed(cfg.trainer.seed)
    if args.model is None:
        from transformers import AutoModelForCausalLM, LlamaConfig

        s = TINY if args.tiny else SMOLLM2_135M
        layers = args.layers or s.layers
        config = LlamaConfig(
            vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=layers, num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate, max_position_embeddings=8192,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
            tie_word_embeddings=True, initializer_range=s.init_std, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
            pad_token_id=EOS_ID,
        )  # fmt: skip
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch_dtype(cfg.model.dtype), attn_implementation=cfg.model.attn_implementation
        )
        mask_id, eos_id, pad_id, n_tokens = s.vocab - 1, EOS_ID, EOS_ID, s.vocab - 1
    else:
        tokenizer = load_tokenizer(args.model)
        model = load_model(
            args.model,
            cfg.model.dtype,
            attn_implementation=cfg.model.attn_implementation,
            num_layers=args.layers,
        )
        mask_id = ensure_mask_token(model, tokenizer, cfg.stage.mask_token)
        eos_id, pad_id, n_tokens = tokenizer.eos_token_id, tokenizer.pad_token_id, len(tokenizer)
    c = model.config
    shape = {
        "source": args.model or f"{RANDOM_SOURCE} Llama, {'tiny' if args.tiny else 'SmolLM2-135M'} shape",
        "layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads, "intermediate": c.intermediate_size,
        "vocab": model.get_input_embeddings().weight.shape[0], "tied": bool(c.tie_word_embeddings),
        "parameters": sum(p.numel() for p in model.parameters()),
    }  # fmt: skip
    if cfg.peft.kind == PeftKind.lora:
        with contextlib.redirect_stdout(sys.stderr):  # peft prints its trainable count
            model = apply_lora(model, cfg, mask_id)
    model.train()
    return Built(model, mask_id, eos_id, pad_id, n_tokens, shape)


def step_rows(args: argparse.Namespace, cfg: Any, built: Built) -> list[dict[str, list[int]]]:
    """The rows of every step of a variant, in order (every variant reads the same)."""
    n = cfg.trainer.per_device_train_batch_size * (args.warmup + args.steps + int(args.profile))
    max_len = cfg.data.max_len
    if args.rows is not None:
        return file_rows(args.rows, n, max_len)
    return synthetic_rows(
        n, args.prompt_len, args.answer_len, args.jitter, built.n_tokens, built.mask_id, built.eos_id, max_len,
        args.seed,
    )  # fmt: skip


def batches(variant: str, rows: list[dict[str, list[int]]], cfg: Any, built: Built) -> list[dict[str, Any]]:
    """The rows collated as the variant's stage collates them: plain as sft (no block padding), MARS with each
    example padded to a multiple of K with EOS targets (``prove.train.collate.Collator``)."""
    from prove.train.collate import Collator

    k = 1 if variant == "plain" else cfg.stage.block_size
    collate = Collator(pad_token_id=built.pad_id, eos_token_id=built.eos_id, block_size=k)
    b = cfg.trainer.per_device_train_batch_size
    return [collate(rows[i : i + b]) for i in range(0, len(rows), b)]


def plain_loss(model: Any, batch: dict[str, Any], cfg: Any, mask_id: int) -> tuple[Any, int, int]:
    """transformers' causal-LM loss on the answer: ``(loss, tokens fed, targets)``."""
    ids, labels = batch["input_ids"], batch["labels"]  # (B, L)
    out = model(input_ids=ids, attention_mask=batch["attention_mask"], labels=labels, use_cache=False)
    return out.loss, ids.numel(), int((labels[:, 1:] != IGNORE_INDEX).sum())


def mars_loss_now(model: Any, batch: dict[str, Any], cfg: Any, mask_id: int) -> tuple[Any, int, int]:
    """``MarsTrainer.compute_loss`` without the Trainer: the same :class:`prove.train.mars_step.MarsStep` (no accelerator
    wrapper: ``model`` is its own unwrapped model; the mask built every step), ``stage.depth_decay``'s weights
    included: ``(loss, tokens fed, targets)``."""
    from prove.train.mars_step import MarsStep

    step = MarsStep.for_model(
        model, cfg.stage.attention, mask_id, cfg.stage.block_size,
        ar_weight=cfg.stage.ar_weight, ce_chunk_rows=cfg.stage.ce_chunk_rows, depth_decay=cfg.stage.depth_decay,
    )  # fmt: skip
    out = step.loss(model, model, batch)
    return out.loss, out.at.inputs.ids.numel(), out.at.rows.numel()


def mars_loss_full(model: Any, batch: dict[str, Any], cfg: Any, mask_id: int) -> tuple[Any, int, int]:
    """The reference step: the full ``[noisy | clean]`` input and its ``(B, 2L, V)`` logits (the trainer's
    ``compute_loss`` before the trimmed step): ``(loss, tokens fed, targets)``."""
    from prove.train.losses import mars_loss
    from prove.train.masks import block_inputs, mars_attention_mask

    ids, labels = batch["input_ids"], batch["labels"]  # (B, L)
    x, pos = block_inputs(ids, labels, mask_id)  # (B, 2L) each
    impl = getattr(model.config, "_attn_implementation", None)
    dtype = model.get_input_embeddings().weight.dtype
    mask = mars_attention_mask(impl, ids.shape[1], cfg.stage.block_size, dtype, ids.device)
    logits = model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=False).logits  # (B, 2L, V)
    targets = 2 * int((labels[:, 1:] != IGNORE_INDEX).sum())
    return mars_loss(logits, labels, cfg.stage.ar_weight).loss, x.numel(), targets


LOSSES = {"plain": plain_loss, "mars": mars_loss_now, "mars-full": mars_loss_full}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def optimizer_step(variant: str, built: Built, params: list[Any], cfg: Any) -> Any:
    """One optimizer step of ``variant`` on a batch (loss, backward, gradient clipping, AdamW over ``params``):
    a function of the batch returning ``{loss, fed, targets}``."""
    import torch

    model, loss_fn = built.model, LOSSES[variant]
    opt = torch.optim.AdamW(params, lr=cfg.trainer.learning_rate, weight_decay=cfg.trainer.weight_decay)

    def step(batch: dict[str, Any]) -> dict[str, Any]:
        loss, fed, targets = loss_fn(model, batch, cfg, built.mask_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.trainer.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"loss": float(loss.detach()), "fed": fed, "targets": targets}

    return step


def timed_step(step: Any, batch: dict[str, Any], profile_vocab: int | None) -> dict[str, Any]:
    """``step(batch)`` with its wall and CPU seconds; under the profiler (its breakdown as ``profile``) when
    ``profile_vocab`` is set."""
    out: dict[str, Any] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    if profile_vocab is not None:
        out["profile"] = breakdown(profiled(lambda: out.update(step(batch))), profile_vocab)
    else:
        out.update(step(batch))
    return {**out, "s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def run_variant(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """Build, then ``--warmup`` + ``--steps`` optimizer steps of ``variant``; its record (times, losses, RSS)."""
    import torch

    cfg = load_config(args)
    built = build(args, cfg)
    params = [p for p in built.model.parameters() if p.requires_grad]
    step = optimizer_step(variant, built, params, cfg)
    steps = batches(variant, step_rows(args, cfg, built), cfg, built)
    setup_rss = peak_rss_bytes()
    load = os.getloadavg()[0]
    end = args.warmup + args.steps
    done = []
    for i, batch in enumerate(steps):
        profiling = args.profile and i == end  # one more step, after the timed ones
        done.append(timed_step(step, batch, built.shape["vocab"] if profiling else None))
        kind = "warm-up" if i < args.warmup else "timed" if i < end else "profiled"
        print(f"  {variant} step {i + 1}/{len(steps)} ({kind}): {done[-1]['s']:.3g} s", file=sys.stderr)
    times = [d["s"] for d in done]
    losses = [d["loss"] for d in done]
    return {
        "variant": variant,
        "pid": os.getpid(),
        "isolated": not args.in_process,
        "median_s": statistics.median(times[args.warmup : end]),
        "median_cpu_s": statistics.median(d["cpu_s"] for d in done[args.warmup : end]),
        "step_s": times[args.warmup : end],
        "warmup_s": times[: args.warmup],
        "losses": losses,
        "first_loss": losses[0],
        "tokens_fed": [d["fed"] for d in done],
        "targets": [d["targets"] for d in done],
        "peak_rss_bytes": peak_rss_bytes(),
        "setup_rss_bytes": setup_rss,
        "threads": torch.get_num_threads(),
        "loadavg_1min": [load, os.getloadavg()[0]],
        "trainable_parameters": sum(p.numel() for p in params),
        "profile": next((d["profile"] for d in done if "profile" in d), None),
        "config": settings(args, cfg, built),
    }


def settings(args: argparse.Namespace, cfg: Any, built: Built) -> dict[str, Any]:
    """What the run measured: the model, the recipe's resolved settings and the rows."""
    rows = (
        {"source": str(args.rows)}
        if args.rows is not None
        else {"source": "synthetic", "prompt_len": args.prompt_len, "answer_len": args.answer_len,
              "jitter": args.jitter, "seed": args.seed}
    )  # fmt: skip
    p = cfg.peft  # a dataclass: prove.train.config.PeftConfig
    return {
        "model": built.shape,
        "recipe": args.recipe,
        "overrides": list(args.overrides),
        "mask_id": built.mask_id,
        "block_size": cfg.stage.block_size,
        "max_len": cfg.data.max_len,
        "micro_batch": cfg.trainer.per_device_train_batch_size,
        "dtype": cfg.model.dtype,
        "attn_implementation": cfg.model.attn_implementation,
        "peft": {**asdict(p), "kind": p.kind.value},
        "ce_chunk_rows": cfg.stage.ce_chunk_rows,
        "ar_weight": cfg.stage.ar_weight,
        "depth_decay": cfg.stage.depth_decay,
        "lr": cfg.trainer.learning_rate,
        "weight_decay": cfg.trainer.weight_decay,
        "max_grad_norm": cfg.trainer.max_grad_norm,
        "seed": cfg.trainer.seed,
        "warmup": args.warmup,
        "steps": args.steps,
        "rows": rows,
    }


# -- the driver: every (repeat, variant), each in a fresh process -------------------------------------------------


def schedule(order: list[str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, variant)`` in run order: ``order``, then reversed, and so on."""
    return [(r, v) for r in range(repeats) for v in (order if r % 2 == 0 else order[::-1])]


def spawn(argv: list[str], variant: str) -> dict[str, Any]:
    """Run one variant in a fresh interpreter (its output to our stderr) and read its record back."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        me = str(Path(__file__).resolve())
        cmd = [sys.executable, me, *argv, "--worker", variant, "--worker-out", str(out)]
        rc = subprocess.run(cmd, stdout=sys.stderr).returncode
        if rc != 0:
            raise SystemExit(f"bench_mars_step: the {variant} process exited with {rc}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker is not None:  # a child of the driver below
        record = run_variant(args, args.worker)
        args.worker_out.write_text(json.dumps(record))
        return 0
    env = provenance()
    plan = schedule(args.order, args.repeats)
    print(
        f"bench_mars_step: {len(args.order)} variants × {args.repeats} repeats, {args.warmup} warm-up + "
        f"{args.steps} timed steps each, {'in this process' if args.in_process else 'a process each'}",
        file=sys.stderr,
    )
    if args.repeats < 3 and {"mars", "plain"} <= set(args.order):
        print(
            "bench_mars_step: MARS / plain wants --repeats 3 or more (a median of pairwise ratios)",
            file=sys.stderr,
        )
    started = time.time()
    runs = []
    for index, (repeat, variant) in enumerate(plan):
        print(f"repeat {repeat + 1}: {variant}", file=sys.stderr)
        rec = run_variant(args, variant) if args.in_process else spawn(argv, variant)
        rec.update(repeat=repeat, index=index)
        runs.append(rec)
    config = runs[0].pop("config")
    for r in runs[1:]:
        r.pop("config")
    result = {
        "tool": "tools/bench_mars_step.py",
        "argv": argv,
        "order": args.order,
        "repeats": args.repeats,
        "config": config,
        "env": {**env, "loadavg_end": list(os.getloadavg()), "seconds": round(time.time() - started, 1)},
        "runs": runs,
        "summary": summarise(runs, args.order),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"\n-> {args.out / 'result.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

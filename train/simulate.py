"""How far the acceptance simulated while training is from decoding (docs/training.md, "Acceptance while training").

    python -m prove.train.simulate --model runs/tiny/mars --prompts runs/data/arithmetic/test.jsonl --n-prompts 30
    python -m prove.train.simulate --model runs/smollm2-135m/mars --prompts runs/data/smollm2-mix/test-lists.jsonl \\
        --n-prompts 30 --max-new-tokens 256 --chat
    python -m prove.train.simulate --model runs/smollm2-chat/round-3/mars --suite mt-bench,humaneval \\
        --per-category 4 --max-new-tokens 256          # public suites (prove.data.suites), by category

Each prompt is decoded with prove-lossless on our engine (its output is the checkpoint's own greedy output, token
for token, and its stats are the measured tokens per cycle and per-depth acceptance); then the same prompts and
outputs are scored the way stage mars scores its eval set while it trains — teacher-forced ``[noisy | clean]``
passes, no generation (:meth:`prove.train.trainer.MarsTrainer.evaluate`, :mod:`prove.train.acceptance`). Labels
that are the model's own greedy tokens leave no off-policy block, so what remains between the two numbers is the
simulation itself (blocks aligned to multiples of K from the sequence start, where a decode cycle starts wherever the
previous one ended). The aligned mean counts every stretch of the response once, where a decode spends more cycles on
the stretches that commit little; ``walk_estimate`` weights each block by its cycles per position (the harmonic mean,
``AcceptanceSums.summary``'s ``tpc_walk_k``) and is printed beside it. The checkpoint's own in-training eval (on held-out *training* rows, whose labels need not be its
greedy tokens) is printed beside, from its prove.json: the gap between that and the greedy-output figure is the
off-policy gap of the training data.

Writes ``--out`` (JSON): measured, simulated and walked tokens per cycle, per-depth acceptance each way (counted as the
decoder counts it: a depth proposed past the end of turn is proposed, not accepted), the relative error, and the
same for each prompt category (a suite's, or a prompt file's ``category`` field) under ``by_category``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from prove.train.acceptance import AcceptanceSums
from tqdm import tqdm


def read_records(prompts: str | None, n_prompts: int, suites: str | None, per_category: int | None,
                 suite_files: list[str] | None = None) -> list[Any]:  # fmt: skip
    """The prompts to decode: the first ``n_prompts`` of a prompt file, or the first ``per_category`` of each category
    of each named suite (comma-separated; ``suite_files`` entries ``NAME=FILE`` replace a suite's packaged file)."""
    from prove.data.prompts import read_prompts

    if (prompts is None) == (suites is None):
        raise SystemExit("give --prompts FILE or --suite NAME[,NAME...] (mt-bench, humaneval, arithmetic)")
    if prompts is not None:
        records = read_prompts(prompts)[:n_prompts]
        if not records:
            raise SystemExit(
                f"{prompts} holds no prompts: pass a prompt file (JSONL with prompt / messages, or text)"
            )
        return records
    from prove.data.suites import load_suite

    files = dict(f.split("=", 1) for f in suite_files or [])
    names = [n.strip() for n in suites.split(",") if n.strip()]  # type: ignore[union-attr]
    if "mt-bench-2" in names:
        raise SystemExit("--suite mt-bench-2 needs first answers: simulate mt-bench (first turns) instead")
    try:
        return [
            r for n in names for r in load_suite(n, source=files.get(n), per_category=per_category).records
        ]
    except (KeyError, ValueError, FileNotFoundError) as e:
        raise SystemExit(f"--suite {suites}: {e}") from None


def decode_greedy(
    model: str,
    records: list[Any],
    max_new_tokens: int,
    block_size: int,
    align: int,
    chat: bool = False,
    device: str = "cpu",
) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    """prove-lossless at K′ = ``block_size`` over ``records``: ``(decoder, rows {input_ids, labels, category},
    stats)``: the rows each prompt followed by its output (labels on the output; an output cut by ``max_new_tokens``
    ends on the last edge of the ``align``-token blocks they are scored in, the trained K, since no end of turn
    follows it), ``stats`` each decode's."""
    from prove.data.prompts import render
    from prove.decode import Decoder

    dec = Decoder.from_pretrained(model, method="prove-lossless", block_size=block_size, device=device)
    rows, stats = [], []
    eos = set(dec.eos_ids())
    for rec in tqdm(records, desc="prove-lossless", unit="prompt"):
        ids = dec.encode(render(rec, chat))
        res = dec.generate(ids, max_new_tokens)
        seq = ids + res.token_ids
        if not (res.token_ids and res.token_ids[-1] in eos):
            # cut by max_new_tokens: end on a block edge, so the collator's EOS padding is no end of turn
            seq = seq[: max(len(seq) // align * align, len(ids) + 1)]
        category = rec.category or "all"
        rows.append({"input_ids": seq, "labels": [-100] * len(ids) + seq[len(ids) :], "category": category})
        stats.append(res.stats)
    return dec, rows, stats


def pooled(stats: list[Any]) -> dict[str, Any]:
    """What the decoder measured over these decodes: tokens per cycle and per-depth acceptance, pooled."""
    accepted: list[int] = []
    proposed: list[int] = []
    for s in stats:
        accepted = _add(accepted, s.accepted_by_depth)
        proposed = _add(proposed, s.proposed_by_depth)
    tokens, cycles = sum(s.new_tokens for s in stats), sum(s.cycles for s in stats)
    return {
        "tokens_per_cycle": tokens / max(cycles, 1),
        "accept_by_depth": [a / p if p else None for a, p in zip(accepted, proposed, strict=True)],
        "prompts": len(stats),
        "new_tokens": tokens,
        "cycles": cycles,
    }


def _add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def simulate(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], block_size: int, mask_id: int, batch_size: int = 8
) -> tuple[dict[str, float], AcceptanceSums]:
    """Stage mars's eval (:meth:`MarsTrainer.evaluate`) on ``rows``: its ``eval_*`` metrics without the prefix, and
    the counts behind them."""
    from prove.train.collate import Collator
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            use_cpu=model.device.type == "cpu",
            report_to=[],
            per_device_train_batch_size=batch_size,
        )
        trainer = MarsTrainer(
            model=model,
            args=args,
            processing_class=tokenizer,
            data_collator=Collator(tokenizer.pad_token_id or 0, tokenizer.eos_token_id, block_size),
            mask_token_id=mask_id,
            block_size=block_size,
        )
        metrics = trainer.evaluate(rows)
    assert trainer.last_acceptance is not None
    return {k.removeprefix("eval_"): v for k, v in metrics.items()}, trainer.last_acceptance


def accept_by_depth(sums: AcceptanceSums, k: int) -> list[float]:
    """Per-depth acceptance at depths 1..``k`` counted as the decoder counts it (``Stats.accepted_by_depth`` /
    ``proposed_by_depth``): every cycle proposes every depth, so a depth past the end of turn counts as proposed and
    not accepted (stage mars's ``eval_accept_d{d}`` leaves such blocks out of depth d instead)."""
    blocks = max(float(sums.blocks), 1.0)
    return [float(sums.depth_hits[d]) / blocks for d in range(k)]


def compare(
    dec: Any, rows: list[dict[str, Any]], stats: list[Any], meta: Any, k: int, batch_size: int
) -> dict[str, Any]:
    """The decoder's measurement of these decodes against stage mars's simulation on their outputs."""
    assert meta.mask_token_id is not None, "a checkpoint with a block size has its <|mask|> id (prove.json)"
    scored = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]
    sim, sums = simulate(dec.model, dec.tokenizer, scored, meta.block_size, meta.mask_token_id, batch_size)
    measured = pooled(stats)
    simulated = {
        "tokens_per_cycle": sim[f"tpc_k{k}"],
        "accept_by_depth": accept_by_depth(sums, k),
        "offpolicy": sim["offpolicy"],
        "blocks": sim["blocks"],
    }
    walked = {
        "tokens_per_cycle": sim[f"tpc_walk_k{k}"],
        "accept_by_depth": sums.walk_accept_by_depth() if k == meta.block_size else None,
    }
    error = simulated["tokens_per_cycle"] / measured["tokens_per_cycle"] - 1
    return {
        "measured": measured,
        "simulated_on_greedy_outputs": simulated,
        "relative_error": error,
        "walk_estimate": walked,
        "walk_relative_error": walked["tokens_per_cycle"] / measured["tokens_per_cycle"] - 1,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m prove.train.simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a MARS checkpoint (prove.json with its block size)")
    p.add_argument(
        "--prompts", help="prompt file: JSONL with prompt / messages (and category), or text lines"
    )
    p.add_argument("--n-prompts", type=int, default=30, help="--prompts: the first N")
    p.add_argument(
        "--suite", help="public prompt suites instead, comma-separated: mt-bench, humaneval, arithmetic"
    )
    p.add_argument("--per-category", type=int, default=None, help="--suite: the first N of each category")
    p.add_argument("--suite-file", action="append", help="NAME=FILE: a local copy of a suite's file")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--block-size", type=int, default=None, help="K′ to decode and simulate (default: trained K)"
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap raw-text prompts as one user turn of the template"
    )
    p.add_argument("--batch-size", type=int, default=8, help="rows per teacher-forced pass")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="outputs/simulate/result.json")
    return p.parse_args(argv)


def trained_block(model: str, block_size: int | None) -> tuple[Any, int]:
    """The checkpoint's prove.json and K′: ``block_size``, at most the trained K (its default)."""
    from prove.common.checkpoint import read_prove_json

    meta = read_prove_json(model)
    if meta is None or not meta.block_size:
        raise SystemExit(f"{model} has no prove.json with a block size: pass a stage mars checkpoint")
    k = block_size or meta.block_size
    if k > meta.block_size:
        raise SystemExit(
            f"--block-size {k} is above the trained K = {meta.block_size}: pass ≤ {meta.block_size}"
        )
    return meta, k


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta, k = trained_block(args.model, args.block_size)
    records = read_records(args.prompts, args.n_prompts, args.suite, args.per_category, args.suite_file)
    dec, rows, stats = decode_greedy(
        args.model, records, args.max_new_tokens, k, meta.block_size, args.chat, args.device
    )
    categories: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        categories.setdefault(row["category"], []).append(i)
    training = ((meta.extra or {}).get("eval") or {}).get("output") or {}
    result = {
        "model": args.model,
        "prompts": args.prompts or f"suite {args.suite}",
        "block_size": k,
        "max_new_tokens": args.max_new_tokens,
        **compare(dec, rows, stats, meta, k, args.batch_size),
        "by_category": {
            c: compare(dec, [rows[i] for i in idx], [stats[i] for i in idx], meta, k, args.batch_size)
            for c, idx in categories.items()
        }
        if len(categories) > 1
        else {},
        "simulated_on_training_rows": training.get(f"eval_tpc_k{k}"),
        "training_rows_offpolicy": training.get("eval_offpolicy"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result)
    print(f"-> {out}")
    return 0


def print_summary(result: dict[str, Any]) -> None:
    """Measured tokens per cycle, the simulation on the greedy outputs (its error) and on the training rows."""
    measured, simulated = result["measured"], result["simulated_on_greedy_outputs"]
    print(f"K′ = {result['block_size']}, {measured['prompts']} prompts, {measured['new_tokens']} tokens")
    print(f"  measured (prove-lossless)          {measured['tokens_per_cycle']:.3f} tokens per cycle")
    print(
        f"  simulated on its greedy outputs    {simulated['tokens_per_cycle']:.3f}  "
        f"({result['relative_error']:+.1%}; off-policy blocks {simulated['offpolicy']:.1%})"
    )
    walked = result["walk_estimate"]["tokens_per_cycle"]
    print(f"  walked (harmonic mean over blocks) {walked:.3f}  ({result['walk_relative_error']:+.1%})")
    for category, r in result["by_category"].items():
        print(
            f"  {category:<34} {r['measured']['tokens_per_cycle']:.3f} measured, "
            f"{r['simulated_on_greedy_outputs']['tokens_per_cycle']:.3f} simulated ({r['relative_error']:+.1%}), "
            f"{r['walk_estimate']['tokens_per_cycle']:.3f} walked ({r['walk_relative_error']:+.1%})"
        )
    if result["simulated_on_training_rows"] is not None:
        print(
            f"  simulated on held-out train rows   {result['simulated_on_training_rows']:.3f}  "
            f"(off-policy blocks {result['training_rows_offpolicy']:.1%}; prove.json's eval)"
        )


if __name__ == "__main__":
    raise SystemExit(main())

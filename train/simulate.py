"""How far the acceptance simulated while training is from decoding (docs/training.md, "Acceptance while training").

    python -m prove.train.simulate --model runs/tiny/mars --prompts runs/data/arithmetic/test.jsonl --n-prompts 30
    python -m prove.train.simulate --model runs/smollm2-135m/mars --prompts runs/data/smollm2-mix/test-lists.jsonl \\
        --n-prompts 30 --max-new-tokens 256 --chat

Each prompt is decoded with prove-lossless on our engine (its output is the checkpoint's own greedy output, token
for token, and its stats are the measured tokens per cycle and per-depth acceptance); then the same prompts and
outputs are scored the way stage mars scores its eval set while it trains — teacher-forced ``[noisy | clean]``
passes, no generation (:meth:`prove.train.trainer.MarsTrainer.evaluate`, :mod:`prove.train.acceptance`). Labels
that are the model's own greedy tokens leave no off-policy block, so what remains between the two numbers is the
simulation itself (blocks aligned to multiples of K from the sequence start, where a decode cycle starts wherever the
previous one ended). The checkpoint's own in-training eval (on held-out *training* rows, whose labels need not be its
greedy tokens) is printed beside, from its prove.json: the gap between that and the greedy-output figure is the
off-policy gap of the training data.

Writes ``--out`` (JSON): measured and simulated tokens per cycle, per-depth acceptance both ways (counted as the
decoder counts it: a depth proposed past the end of turn is proposed, not accepted), the relative error.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from prove.train.acceptance import AcceptanceSums
from tqdm import tqdm


def decode_greedy(
    model: str,
    prompts: str,
    n_prompts: int,
    max_new_tokens: int,
    block_size: int,
    align: int,
    chat: bool = False,
    device: str = "cpu",
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """prove-lossless at K′ = ``block_size`` over the first ``n_prompts`` of ``prompts``: ``(decoder, rows
    {input_ids, labels}, measured)``: the rows each prompt followed by its output (labels on the output; an output cut
    by ``max_new_tokens`` ends on the last edge of the ``align``-token blocks they are scored in, the trained K, since
    no end of turn follows it), ``measured`` the pooled stats."""
    from prove.data.prompts import read_prompts, render
    from prove.decode import Decoder

    dec = Decoder.from_pretrained(model, method="prove-lossless", block_size=block_size, device=device)
    records = read_prompts(prompts)[:n_prompts]
    if not records:
        raise ValueError(
            f"{prompts} holds no prompts: pass a prompt file (JSONL with prompt / messages, or text)"
        )
    rows, tokens, cycles = [], 0, 0
    accepted: list[int] = []
    proposed: list[int] = []
    eos = set(dec.eos_ids())
    for rec in tqdm(records, desc="prove-lossless", unit="prompt"):
        ids = dec.encode(render(rec, chat))
        res = dec.generate(ids, max_new_tokens)
        seq = ids + res.token_ids
        if not (res.token_ids and res.token_ids[-1] in eos):
            # cut by max_new_tokens: end on a block edge, so the collator's EOS padding is no end of turn
            seq = seq[: max(len(seq) // align * align, len(ids) + 1)]
        rows.append({"input_ids": seq, "labels": [-100] * len(ids) + seq[len(ids) :]})
        tokens += res.stats.new_tokens
        cycles += res.stats.cycles
        accepted = _add(accepted, res.stats.accepted_by_depth)
        proposed = _add(proposed, res.stats.proposed_by_depth)
    measured = {
        "tokens_per_cycle": tokens / max(cycles, 1),
        "accept_by_depth": [a / p if p else None for a, p in zip(accepted, proposed, strict=True)],
        "prompts": len(records),
        "new_tokens": tokens,
        "cycles": cycles,
    }
    return dec, rows, measured


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m prove.train.simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a MARS checkpoint (prove.json with its block size)")
    p.add_argument(
        "--prompts", required=True, help="prompt file: JSONL with prompt / messages, or text lines"
    )
    p.add_argument("--n-prompts", type=int, default=30)
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
    dec, rows, measured = decode_greedy(
        args.model,
        args.prompts,
        args.n_prompts,
        args.max_new_tokens,
        k,
        meta.block_size,
        args.chat,
        args.device,
    )
    assert meta.mask_token_id is not None, "a checkpoint with a block size has its <|mask|> id (prove.json)"
    sim, sums = simulate(dec.model, dec.tokenizer, rows, meta.block_size, meta.mask_token_id, args.batch_size)
    simulated = {
        "tokens_per_cycle": sim[f"tpc_k{k}"],
        "accept_by_depth": accept_by_depth(sums, k),
        "offpolicy": sim["offpolicy"],
        "blocks": sim["blocks"],
    }
    training = ((meta.extra or {}).get("eval") or {}).get("output") or {}
    result = {
        "model": args.model,
        "prompts": args.prompts,
        "block_size": k,
        "max_new_tokens": args.max_new_tokens,
        "measured": measured,
        "simulated_on_greedy_outputs": simulated,
        "relative_error": simulated["tokens_per_cycle"] / measured["tokens_per_cycle"] - 1,
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
    if result["simulated_on_training_rows"] is not None:
        print(
            f"  simulated on held-out train rows   {result['simulated_on_training_rows']:.3f}  "
            f"(off-policy blocks {result['training_rows_offpolicy']:.1%}; prove.json's eval)"
        )


if __name__ == "__main__":
    raise SystemExit(main())

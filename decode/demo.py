"""Interim decoding demo (``make demo``), until the training pipeline produces real checkpoints.

    python -m prove.decode.demo build DIR      # DIR/model: a tiny random Qwen2 with <|mask|> and prove.json
                                               # DIR/prompts.jsonl: a few arithmetic questions (chat)
    prove-decode model=DIR/model method=ar prompts=DIR/prompts.jsonl output=DIR/ar.jsonl
    prove-decode model=DIR/model method=prove-lossless prompts=DIR/prompts.jsonl output=DIR/prove-lossless.jsonl
    python -m prove.decode.demo report DIR/ar.jsonl DIR/prove-lossless.jsonl

The model is untrained, so its block proposals are rarely right: ProVe-lossless commits little more than one
token per cycle here (and is slower than AR). What the demo shows is the plumbing: both methods give the same
tokens, and the stats each record carries.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BLOCK_SIZE = 8


def build(out: str | Path, n_prompts: int = 4, seed: int = 0) -> Path:
    import torch
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.data.tokenizer import build_tiny_tokenizer
    from prove.decode.checkpoint import MASK_TOKEN, ProveMeta, write_prove_json
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    rows = generate_arithmetic(400 + n_prompts, seed=seed)
    tok = build_tiny_tokenizer(rows[:400], vocab_size=320)
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # the default init (std 0.02) greedily repeats one token; make the output varied
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    meta = ProveMeta(stage="mars", base_model="random (prove.decode.demo)", block_size=BLOCK_SIZE,
                     mask_token=MASK_TOKEN, mask_token_id=mask_id, extra={"note": "untrained demo weights"})
    write_prove_json(out / "model", meta)
    write_jsonl([as_prompt(r) for r in rows[400:]], out / "prompts.jsonl")
    print(f"built {out / 'model'} (vocab {len(tok)}, block_size {BLOCK_SIZE}) and {out / 'prompts.jsonl'}")
    return out


def report(paths: list[str | Path]) -> str:
    """A per-method table of the decode stats, and agreement of every method's tokens with the first file's."""
    runs = {Path(p).stem: [json.loads(line) for line in Path(p).read_text().splitlines()] for p in paths}
    ref_name, ref = next(iter(runs.items()))
    lines = [
        f"{'method':<16} {'prompts':>7} {'tokens':>7} {'cycles':>7} {'tok/cycle':>9} {'passes':>7} {'wall s':>7} "
        f"same tokens as {ref_name}",
    ]
    for name, recs in runs.items():
        total = {k: sum(r["stats"][k] for r in recs) for k in ("new_tokens", "cycles", "model_passes", "wall_s")}
        same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(recs, ref, strict=True))
        lines.append(
            f"{name:<16} {len(recs):>7} {total['new_tokens']:>7} {total['cycles']:>7} "
            f"{total['new_tokens'] / max(total['cycles'], 1):>9.2f} {total['model_passes']:>7} "
            f"{total['wall_s']:>7.3f} {same}/{len(recs)}"
        )
    lines.append("(tok/cycle counts the correction/bonus token; the demo model is untrained)")
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prove.decode.demo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write DIR/model and DIR/prompts.jsonl")
    b.add_argument("dir")
    b.add_argument("--prompts", type=int, default=4)
    r = sub.add_parser("report", help="summarise prove-decode output files")
    r.add_argument("outputs", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        build(args.dir, args.prompts)
    else:
        report(args.outputs)


if __name__ == "__main__":
    main()

"""tools/bench_mars_step.py (``make bench-step``) times what it says it times: on the same rows and starting weights
its ``mars`` step's loss is ``MarsTrainer.compute_loss``'s and the full 2L reference's (``mars-full``), its
``plain`` loss is the causal-LM cross-entropy on the answer tokens; its result holds every run and the ratios; and
each variant runs in a process of its own (slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools_helpers import load_tool

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_mars_step.py"
K = 8  # the recipe's block size
# (prompt, answer) tokens: prompts ending on a block edge (16, 8, 24) and off it
SHAPES = [(16, 10), (13, 7), (21, 12), (8, 5), (19, 9), (24, 14), (11, 3), (30, 8)]


bench = load_tool("bench_mars_step")


def _write_rows(path: Path, n_tokens: int) -> Path:
    import random

    rng = random.Random(1)
    with path.open("w") as f:
        for p, a in SHAPES:
            ids = [rng.randrange(3, n_tokens) for _ in range(p + a)]
            f.write(json.dumps({"prompt_ids": ids[:p], "answer_ids": ids[p:]}) + "\n")
    return path


def _save_tiny_folder(path: Path, tokenizer) -> Path:
    from tests.gguf_helpers import tiny_llama

    tiny_llama(tokenizer, layers=2, init_std=0.2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("source", ["random", "folder"])
def test_the_three_steps_are_the_trainers_the_reference_and_transformers_own(
    source, tmp_path, stock_tokenizer
):
    import torch
    import torch.nn.functional as F
    from prove.train.collate import Collator
    from prove.train.masks import padded_length
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    if source == "random":
        # the default model at a tiny shape, rows from a file, CE chunks of 7 rows, λ = 0.5
        rows_file = _write_rows(tmp_path / "rows.jsonl", 299)
        # the full-logits reference has no depth weights: compare it at MARS's uniform loss (the recipe sets 0.6)
        argv = ["--tiny", "--rows", str(rows_file), "stage.ce_chunk_rows=7", "stage.ar_weight=0.5"]
        argv += ["stage.depth_decay=1.0"]
    else:
        # a model folder whose tokenizer lacks <|mask|> (the embeddings grow a row), synthetic rows, the noisy loss
        # weighted by depth (the trainer's; the full 2L reference has no weights)
        folder = _save_tiny_folder(tmp_path / "model", stock_tokenizer)
        argv = ["--model", str(folder), "--prompt-len", "20", "--answer-len", "11", "--steps", "1"]
        argv += ["stage.depth_decay=0.5"]
    argv += ["--in-process", "--repeats", "1", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())

    # the record: every variant once, its steps, and the recipe's settings
    assert result["order"] == list(bench.VARIANTS)
    runs = {r["variant"]: r for r in result["runs"]}
    assert sorted(runs) == sorted(bench.VARIANTS)
    for r in runs.values():
        assert (
            len(r["warmup_s"]) == 1 and len(r["step_s"]) == 1 and r["median_s"] > 0 and r["median_cpu_s"] > 0
        )
        assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"])
        assert r["isolated"] is False and r["peak_rss_bytes"] >= r["setup_rss_bytes"] > 0
        assert r["trainable_parameters"] == runs["plain"]["trainable_parameters"]
    cfg = result["config"]
    assert (cfg["block_size"], cfg["micro_batch"], cfg["max_len"], cfg["dtype"], cfg["attn_implementation"]) == (
        K, 4, 256, "float32", "sdpa",
    )  # fmt: skip
    assert (cfg["peft"]["kind"], cfg["peft"]["r"], cfg["peft"]["alpha"], cfg["peft"]["train_mask_token"]) == (
        "lora", 32, 64, True,
    )  # fmt: skip
    summary = result["summary"]
    assert set(summary["ratios"]) == {"mars/plain", "mars/mars-full"}
    ratio = runs["mars"]["median_s"] / runs["plain"]["median_s"]
    assert summary["ratios"]["mars/plain"] == pytest.approx(ratio)

    # what each variant's first step computed, against the same weights and rows built again here
    args = bench.parse_args(argv)
    config = bench.load_config(args)
    assert config.stage.ce_chunk_rows == (7 if source == "random" else 4096)
    built = bench.build(args, config)
    if source == "folder":
        # <|mask|> added, the embeddings resized
        assert built.mask_id == len(stock_tokenizer) == cfg["mask_id"]
    model = built.model
    rows = bench.step_rows(args, config, built)[:4]
    plain = Collator(pad_token_id=built.pad_id, eos_token_id=built.eos_id)(rows)
    block = Collator(pad_token_id=built.pad_id, eos_token_id=built.eos_id, block_size=K)(rows)
    with torch.no_grad():
        out = model(input_ids=plain["input_ids"], attention_mask=plain["attention_mask"])
        logits = out.logits  # (B, L, V)
        answer_ce = F.cross_entropy(
            logits[:, :-1].flatten(0, 1), plain["labels"][:, 1:].flatten(), ignore_index=-100
        )
        args_t = TrainingArguments(output_dir=str(tmp_path / "trainer"), use_cpu=True, report_to=[])
        trainer = MarsTrainer(
            model=model, args=args_t, mask_token_id=built.mask_id, block_size=K,
            ar_weight=config.stage.ar_weight, ce_chunk_rows=config.stage.ce_chunk_rows,
            depth_decay=config.stage.depth_decay,
        )  # fmt: skip
        trainer_loss = trainer.compute_loss(model, dict(block))
    answers = sum(sum(t != -100 for t in r["labels"]) for r in rows)
    assert runs["plain"]["targets"][0] == answers
    assert runs["plain"]["first_loss"] == pytest.approx(float(answer_ce), rel=1e-5)
    assert runs["mars"]["first_loss"] == pytest.approx(float(trainer_loss), rel=1e-5)
    if source == "random":
        assert runs["mars-full"]["first_loss"] == pytest.approx(float(trainer_loss), rel=1e-5)
        # after a step too
        assert runs["mars"]["losses"] == pytest.approx(runs["mars-full"]["losses"], rel=1e-4)
    else:
        assert runs["mars-full"]["first_loss"] != pytest.approx(float(trainer_loss), rel=1e-3)
    assert runs["plain"]["first_loss"] != pytest.approx(runs["mars"]["first_loss"], rel=1e-3)
    # both streams' targets: each example's answer and its EOS block padding; the trimmed input is narrower
    blocks = sum(padded_length(len(r["input_ids"]), K) - r["labels"].count(-100) for r in rows)
    assert runs["mars"]["targets"] == runs["mars-full"]["targets"]
    assert runs["mars"]["targets"][0] == 2 * blocks
    # fed: plain the rows, mars [noisy blocks from (P − 1) // K on | clean], mars-full [noisy | clean]
    width = block["input_ids"].shape[1]
    noisy = max(padded_length(len(r["input_ids"]), K) - (r["labels"].count(-100) - 1) // K * K for r in rows)
    fed = [runs[v]["tokens_fed"][0] for v in bench.VARIANTS]
    assert fed == [plain["input_ids"].numel(), len(rows) * (noisy + width), len(rows) * 2 * width]


def test_synthetic_rows_are_chat_shaped_and_cut_at_max_len():
    ids = {"n_tokens": 300, "mask_id": 299, "eos_id": 2, "max_len": 256}
    rows = bench.synthetic_rows(50, 160, 90, 0.1, **ids, seed=3)
    assert rows == bench.synthetic_rows(50, 160, 90, 0.1, **ids, seed=3)
    for r in rows:
        prompt = r["labels"].count(-100)
        assert r["labels"][:prompt] == [-100] * prompt and r["labels"][prompt:] == r["input_ids"][prompt:]
        assert 144 <= prompt <= 176 and len(r["input_ids"]) <= 256 and 299 not in r["input_ids"]
        if len(r["input_ids"]) < 256:  # not cut: the whole answer, ending on EOS
            assert 81 <= len(r["input_ids"]) - prompt <= 99 and r["input_ids"][-1] == 2
    assert any(len(r["input_ids"]) == 256 for r in rows)  # 160 + 90 ± 10% crosses 256 now and then
    long = bench.synthetic_rows(2, 400, 20, 0.0, **ids)
    assert all(r["labels"].count(-100) == 255 and len(r["input_ids"]) == 256 for r in long)


def test_rows_file_is_cycled_cut_and_checked(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps({"prompt_ids": [5, 6, 7], "answer_ids": [8, 9]})
        + "\n\n"
        + json.dumps({"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]})
        + "\n"
        + json.dumps({"prompt_ids": [5] * 10, "answer_ids": [9]})  # no answer within max_len: dropped
        + "\n"
    )
    rows = bench.file_rows(path, 5, max_len=6)
    assert [r["input_ids"] for r in rows] == [[5, 6, 7, 8, 9], [5, 6, 7, 8]] * 2 + [[5, 6, 7, 8, 9]]
    assert rows[0]["labels"] == [-100, -100, -100, 8, 9]
    path.write_text(json.dumps({"ids": [1]}) + "\n")
    with pytest.raises(ValueError, match="prompt_ids"):
        bench.file_rows(path, 1, max_len=6)


def test_order_alternates_and_bad_flags_are_refused():
    assert bench.schedule(["plain", "mars", "mars-full"], 3) == [
        (0, "plain"), (0, "mars"), (0, "mars-full"),
        (1, "mars-full"), (1, "mars"), (1, "plain"),
        (2, "plain"), (2, "mars"), (2, "mars-full"),
    ]  # fmt: skip
    for bad in (["--order", "plain,mars2"], ["--order", "mars,mars"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_the_ratio_is_the_median_of_pairwise_ratios_with_the_mars_seconds_beside_it():
    """``make bench-step``'s statistic: each repeat's MARS / plain (one machine state), their median, and MARS's own
    s/step beside it. Catches: the ratio of the two medians (1.29× here, not 1.20×), a MARS step paired with another
    repeat's plain one, a headline without MARS's seconds (a slower plain step then passes for a faster MARS one)."""
    times = [(6.0, 9.0), (8.0, 9.6), (7.0, 7.7)]  # (plain, mars) per repeat: 1.5×, 1.2×, 1.1×
    runs = [
        {"repeat": r, "variant": v, "median_s": t, "peak_rss_bytes": 1, "first_loss": 1.0}
        for r, (plain, mars) in enumerate(times)
        for v, t in (("plain", plain), ("mars", mars))
    ]
    summary = bench.summarise(runs, ["plain", "mars"])
    assert [round(x["mars/plain"], 6) for x in summary["ratios_by_repeat"]] == [1.5, 1.2, 1.1]
    assert summary["ratios"]["mars/plain"] == pytest.approx(1.2)
    assert summary["ratios_of_medians"]["mars/plain"] == pytest.approx(9.0 / 7.0)
    top = summary["headline"]
    assert (top["mars_s"], top["plain_s"], top["mars_over_plain"]) == (9.0, 7.0, pytest.approx(1.2))
    line = bench.headline(summary)
    assert line.startswith("MARS / plain: **1.20×** (median of 3 pairwise ratios: 1.50×, 1.20×, 1.10×)")
    assert line.endswith("MARS 9 s/step, plain 7 s/step")
    slower_plain = [{**r, "median_s": r["median_s"] * (1.5 if r["variant"] == "plain" else 1)} for r in runs]
    assert bench.summarise(slower_plain, ["plain", "mars"])["headline"]["mars_s"] == 9.0


def test_profile_breakdown_sorts_operators_by_kind():
    """A product with a vocabulary-sized input is the head's, not the decoder's; shapes the profiler records as []
    (scalars) are skipped; the kinds add up to the total."""
    v = 300
    ops = [
        ("aten::mm", [[10, 64], [64, v]], 1.0),  # the head
        ("aten::mm", [[10, 64], [64, 128]], 2.0),  # an MLP projection
        ("aten::_scaled_dot_product_flash_attention_for_cpu", [[1, 4, 10, 16]] * 3 + [[], []], 0.5),
        ("aten::_log_softmax", [[10, v], [], []], 0.25),  # the cross-entropy
        ("aten::mul", [[10, 128], [10, 128]], 0.125),
        ("aten::copy_", [[v, 64], [v, 64], []], 0.0625),  # a merged embedding weight
    ]
    got = bench.breakdown(ops, vocab=v)
    assert got == {"matmul": 2.0, "attention": 0.5, "vocabulary": 1.3125, "other": 0.125, "total": 3.9375}


@pytest.mark.slow
def test_each_variant_runs_in_a_process_of_its_own(tmp_path):
    """The command line as ``make bench-step`` runs it: a fresh interpreter per (repeat, variant), the order reversed
    in the second repeat, the same first loss in every process (same rows, same weights), the table on stdout."""
    out = tmp_path / "out"
    flags = "--tiny --order plain,mars --repeats 2 --prompt-len 24 --answer-len 12 --profile".split()
    cmd = [sys.executable, str(TOOL), *flags, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    runs = result["runs"]
    order = [(0, "plain"), (0, "mars"), (1, "mars"), (1, "plain")]
    assert [(r["repeat"], r["variant"]) for r in runs] == order
    assert len({r["pid"] for r in runs} | {os.getpid()}) == 5
    assert all(r["isolated"] and r["peak_rss_bytes"] >= r["setup_rss_bytes"] > 0 for r in runs)
    for variant in ("plain", "mars"):
        first = [r["first_loss"] for r in runs if r["variant"] == variant]
        assert first[0] == first[1]
    assert set(result["summary"]["ratios"]) == {"mars/plain"}
    assert len(result["summary"]["ratios_by_repeat"]) == 2
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "| run | plain | mars | mars / plain |"
    assert lines[2].startswith("| 1 (plain, mars) |") and lines[3].startswith("| 2 (mars, plain) |")
    assert lines[4].startswith("| median |") and " GB" in lines[4]
    # --profile: one more step each, profiled and not timed; its time split by kind in a second table
    assert all(len(r["step_s"]) == 1 and len(r["losses"]) == 3 for r in runs)
    for r in runs:
        p = r["profile"]
        assert (
            p["matmul"] > 0
            and p["vocabulary"] > 0
            and p["total"] == pytest.approx(sum(p[k] for k in bench.PROFILE_KINDS))
        )
    assert (
        lines[6].startswith("| profiled step")
        and lines[8].startswith("| plain |")
        and lines[9].startswith("| mars |")
    )

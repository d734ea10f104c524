"""``hf_compare``: ours vs transformers' ``generate`` (AR vs greedy, SD vs assisted generation under each of its
two draft-length policies) on a random model of a real shape (``prove.decode.random_models``) with a layer-skip
draft, on random prompt ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prove.decode.bench.metrics import PromptRun, paired_speedup

if TYPE_CHECKING:
    from prove.decode.bench.config import BenchConfig
    from prove.decode.bench.rows import RowSpec


def hf_pairs(cfg: BenchConfig, specs: Sequence[RowSpec]) -> list[tuple[str, str]]:
    """(our row, transformers' row) whose paired time ratio ``hf_compare`` reports: ``ar`` with greedy
    ``generate``; each ``sd`` row with the assisted-generation row of its draft-length policy (no cut-off with
    ``hf-assisted``, a cut-off at ``hf_assistant_threshold`` with ``hf-assisted-confidence``)."""
    pairs = [("ar", "hf-greedy")]
    for spec in specs:
        if spec.method != "sd":
            continue
        cut = spec.params.get("draft_threshold") or 0.0
        if cut == 0:
            pairs.append((spec.name, "hf-assisted"))
        elif cut == cfg.hf_assistant_threshold:
            pairs.append((spec.name, "hf-assisted-confidence"))
    return pairs


def hf_compare_setup(cfg: BenchConfig) -> tuple[dict[str, Any], list[list[int]]]:
    """``hf_compare``'s random-weight target and layer-skip draft, and its random prompts."""
    from prove.decode.random_models import SHAPES, random_prompts, random_target_and_draft

    assert cfg.hf_compare is not None
    target, draft = random_target_and_draft(
        cfg.hf_compare, cfg.draft_layers, dtype=cfg.dtype, device=cfg.device, deep_scale=cfg.deep_scale
    )
    vocab = SHAPES[cfg.hf_compare]["vocab_size"]
    prompts = random_prompts(cfg.n_prompts or 3, cfg.prompt_len, vocab)
    return {"tokenizer": None, "model": target, "draft": draft}, prompts


def hf_compare_report(
    cfg: BenchConfig, runs: Mapping[str, Sequence[PromptRun]], n_prompts: int, specs: Sequence[RowSpec]
) -> dict[str, Any]:
    """bench.json's entries that ``hf_compare`` replaces or adds: the models and prompts it made, and the
    paired time ratio of each (ours, transformers') pair with whether their tokens are identical."""
    return {
        "models": {
            "model": f"random {cfg.hf_compare}",
            "verifier": None,
            "draft": f"its first {cfg.draft_layers} layers",
        },
        "prompts": {"path": f"{n_prompts} × {cfg.prompt_len} random ids", "n": n_prompts, "with_answers": 0},
        "hf_compare": {
            "shape": cfg.hf_compare,
            "draft_layers": cfg.draft_layers,
            "prompt_len": cfg.prompt_len,
            "deep_scale": cfg.deep_scale,
            "hf_assistant_threshold": cfg.hf_assistant_threshold,
            **{
                f"{ours}_vs_{theirs}": paired_speedup(runs[ours], runs[theirs])
                for ours, theirs in hf_pairs(cfg, specs)
                if ours in runs and theirs in runs
            },
        },  # fmt: skip
    }


def check_identical(report: Mapping[str, Any], output_dir: str | Path) -> None:
    """``hf_compare`` fails (after writing its report) when ours and transformers' tokens differ."""
    differ = [
        k for k, v in (report.get("hf_compare") or {}).items() if isinstance(v, dict) and not v["identical"]
    ]
    if differ:
        raise RuntimeError(
            f"hf_compare: tokens differ between ours and transformers' ({differ}); see {output_dir}"
        )

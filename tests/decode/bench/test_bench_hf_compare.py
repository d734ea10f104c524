"""prove-bench, hf_compare: the layer-cut draft, and a run on the tiny shape."""

from __future__ import annotations

import pytest
from prove.decode.bench.config import BenchConfig


def test_random_draft_is_a_layer_cut_of_the_target():
    import torch
    from prove.decode.random_models import random_target_and_draft

    target, draft = random_target_and_draft("tiny", 2)
    assert len(draft.model.layers) == 2 and draft.model.layers[1] is target.model.layers[1]
    assert draft.lm_head.weight is target.model.embed_tokens.weight  # tied, shared
    ids = torch.arange(10)[None]
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[2]  # after the target's first 2 layers
        expect = target.lm_head(target.model.norm(h))
        torch.testing.assert_close(draft(ids).logits, expect)
    with pytest.raises(ValueError, match="draft_layers=4"):
        random_target_and_draft("tiny", 4)
    # deep_scale shrinks only the layers the draft skips
    shrunk, _ = random_target_and_draft("tiny", 2, deep_scale=0.5)
    for i, layer in enumerate(shrunk.model.layers):
        factor = 0.5 if i >= 2 else 1.0
        torch.testing.assert_close(
            layer.mlp.down_proj.weight, factor * target.model.layers[i].mlp.down_proj.weight
        )


def test_hf_compare_runs_on_the_tiny_shape(tmp_path):
    """The mode of ``prove-bench hf_compare=qwen2.5-0.5b`` end to end on the tiny shape: ours and transformers'
    rows produce identical tokens and the report carries the paired ratios, ``sd`` beside each of transformers'
    two draft-length policies (a random draft is hopeless: the confidence cut-off drafts far less, ours and
    theirs alike)."""
    from prove.decode.bench.run import run_bench

    out = tmp_path / "cmp"
    cfg = BenchConfig(hf_compare="tiny", draft_layers=2, n_prompts=2, prompt_len=12, max_new_tokens=10,
                      output_dir=str(out), plots=False, progress=False)  # fmt: skip
    report = run_bench(cfg)
    names = ["ar", "hf-greedy", "hf-assisted", "hf-assisted-confidence", "sd cut=0", "sd cut=0.4"]
    assert [r["name"] for r in report["rows"]] == names
    assert report["lossless_violations"] == []
    rows = {r["name"]: r for r in report["rows"]}
    assert all(r["new_tokens"] == 20 for r in report["rows"])  # no EOS: every request runs max_new_tokens
    assert rows["hf-assisted"]["params"] == {"k": 5, "draft_threshold": 0.0}
    assert rows["hf-assisted-confidence"]["params"]["draft_threshold"] == 0.4
    drafted = {n: rows[n]["draft_passes_per_token"] for n in names[2:]}
    assert (
        0 < drafted["sd cut=0.4"] < drafted["sd cut=0"]
        and 0 < drafted["hf-assisted-confidence"] < drafted["hf-assisted"]
    )
    hfc = report["hf_compare"]
    for pair in ("ar_vs_hf-greedy", "sd cut=0_vs_hf-assisted", "sd cut=0.4_vs_hf-assisted-confidence"):
        assert hfc[pair]["identical"] and hfc[pair]["median"] > 0 and len(hfc[pair]["per_prompt"]) == 2
    md = (out / "bench.md").read_text()
    assert "hf_compare (tiny shape, 2-layer draft): ar vs hf-greedy:" in md and "identical" in md

"""``python -m prove.train.simulate``: prove-lossless decoded on our engine, then the same prompts and outputs scored
as stage mars's eval scores its rows."""

from __future__ import annotations

import json

import pytest

from tests.train.helpers import write_checkpoint

K = 4


@pytest.fixture(scope="module")
def mars_ckpt(tmp_path_factory, qwen2_factory, tokenizer):
    model = qwen2_factory(len(tokenizer), seed=0, init_std=0.3)
    return write_checkpoint(tmp_path_factory.mktemp("sim") / "mars", model, tokenizer, block_size=K)


def test_simulation_on_the_models_own_greedy_outputs(mars_ckpt, tmp_path):
    from prove.decode import Decoder
    from prove.train.simulate import main

    prompts = tmp_path / "p.jsonl"
    texts = ["Ana has 3 apples", "How many coins does Ben have?", "7 + 5 ="]
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    out = tmp_path / "r.json"
    assert main(["--model", str(mars_ckpt), "--prompts", str(prompts), "--max-new-tokens", "21",
                 "--batch-size", "2", "--out", str(out)]) == 0  # fmt: skip
    r = json.loads(out.read_text())
    measured, sim = r["measured"], r["simulated_on_greedy_outputs"]
    # what the decoder committed, pooled over the prompts
    dec = Decoder.from_pretrained(str(mars_ckpt), method="prove-lossless")
    stats = [dec.generate(t, 21).stats for t in texts]
    assert measured["new_tokens"] == sum(s.new_tokens for s in stats) == 3 * 21
    assert measured["tokens_per_cycle"] == pytest.approx(63 / sum(s.cycles for s in stats))
    # labels that are the model's own greedy tokens: no block is off-policy (a row shifted by one would be)
    assert sim["offpolicy"] == 0.0 and sim["blocks"] > 0
    assert len(sim["accept_by_depth"]) == K and sim["accept_by_depth"][0] == 1.0
    assert 2.0 <= sim["tokens_per_cycle"] <= K + 1  # depth 1 and the correction, at least
    assert r["relative_error"] == pytest.approx(sim["tokens_per_cycle"] / measured["tokens_per_cycle"] - 1)


def test_a_block_size_above_the_trained_one_is_refused(mars_ckpt, tmp_path):
    from prove.train.simulate import main

    with pytest.raises(SystemExit, match="above the trained K = 4"):
        main(["--model", str(mars_ckpt), "--prompts", str(tmp_path / "none.jsonl"), "--block-size", "8"])

"""recipes/smollm2-135m.yaml end to end on a tiny random Llama (SmolLM2's architecture) read from a GGUF file written
in-process: the self-distillation set, MARS (full fine-tuning, and LoRA with the trainable <|mask|> row), the
verifier cut from the base and distilled, then ProVe decoding — the recipe's own commands with a few steps."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from prove.data import gguf
from prove.data.synthetic import main as write_tasks
from prove.train.pipeline import train

from tests.gguf_helpers import tiny_llama, write_tiny_gguf
from tests.train.helpers import train_config

pytestmark = pytest.mark.slow
pytest.importorskip("gguf")

BASE_LAYERS = 3


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, stock_tokenizer):
    """The recipe's overrides for a tiny base: ``run(stage, *extra)`` trains one of its stages."""
    tmp = tmp_path_factory.mktemp("smollm2")
    mp = pytest.MonkeyPatch()
    mp.setenv(gguf.CACHE_ENV, str(tmp / "cache"))
    base = write_tiny_gguf(
        tmp / "base.gguf", tiny_llama(stock_tokenizer, layers=BASE_LAYERS), stock_tokenizer
    )
    write_tasks(["--out", str(tmp / "data"), "--n", "48", "--test-size", "4", "--tasks", "arithmetic,lists", "--instruct"])  # fmt: skip
    common = [
        "recipe=smollm2-135m",
        "logger=none",
        f"run_dir={tmp / 'run'}",
        f"model.name_or_path={base}",
        f"stages.proposer.distill.data={tmp / 'data' / 'train.jsonl'}",
        f"stages.verifier.distill.data={tmp / 'data' / 'train.jsonl'}",
        "model.attn_implementation=eager",
        "max_len=192",
        "distill.max_new_tokens=24",
        "stages.proposer.distill.num_prompts=12",
        "stages.verifier.distill.num_prompts=6",
        "stages.verifier.layers=1",
        # the recipe generates on vLLM, whose CPU attention needs a head size ≥ 32 (this base's is 8): its engine
        # path on a GGUF base is tests/train/test_distill_vllm.py's; here transformers' batched generate
        "stages.proposer.distill.backend=engine",
        "stages.verifier.distill.backend=engine",
        "+stages.proposer.distill.batch_size=5",  # 12 prompts: batches of 5, 5, 2
        "+stages.verifier.distill.batch_size=4",
        "trainer.per_device_train_batch_size=4",
        "stages.proposer.mars.eval_rows=3",  # the recipe's 48 held out of 2,000; here 3 of the 12 responses
        "trainer.save_steps=2",
        "trainer.seed=0",
        "rounds.count=2",  # one on-policy round: 6 prompts the first 12 did not include, 3 MARS steps
        "rounds.num_prompts=6",
        "rounds.max_steps=3",
        "cpu_threads=null",  # the recipe's 0 sizes threads to the node: keep this process's (and later tests')
    ]

    def run(*extra: str, run_dir=None):
        base_overrides = [f"run_dir={run_dir}" if run_dir and o.startswith("run_dir=") else o for o in common]
        return train(train_config([*base_overrides, *extra]))

    yield run, tmp / "run", base
    mp.undo()


# The recipe's steps (its `steps`, the round written out), each with this test's extra overrides: self-distillation
# set, MARS (full FT), round 2's relabelling and MARS, the cut verifier distilled.
STEPS = [
    ("stage=distill", "stage.role=proposer"),
    ("stage=mars", "peft.kind=none", "max_steps=3", "lr=1e-3"),  # full fine-tuning
    ("stage=distill", "stage.role=proposer", "round=2"),
    ("stage=mars", "round=2", "peft.kind=none", "lr=1e-3"),
    ("stage=distill", "max_steps=2"),
]


@pytest.fixture(scope="module")
def pipeline(recipe):
    """The recipe's steps: ``(generated, mars, relabelled, mars round 2, verifier)``."""
    run, _, _ = recipe
    return [run(*step) for step in STEPS]


def test_steps_are_the_recipes_with_the_round_written_out():
    """make train's runs: the recipe's `steps` with its {round} group once a round, in order (fails if the group
    is expanded entry by entry, relabelling round 3 before round 2's MARS exists, or a step is lost)."""
    from prove.train.recipe import expand

    recipe_steps = train_config(["recipe=smollm2-135m", "stage=mars", "model.name_or_path=x"]).steps
    assert expand(recipe_steps, 3) == [
        "stage=distill stage.role=proposer",
        "stage=mars",
        "stage=distill stage.role=proposer round=2",
        "stage=mars round=2",
        "stage=distill stage.role=proposer round=3",
        "stage=mars round=3",
        "stage=distill",
    ]
    assert expand(recipe_steps, 1) == ["stage=distill stage.role=proposer", "stage=mars", "stage=distill"]


def _embeddings(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()


def test_self_distillation_set_is_the_bases_own_greedy_output(pipeline, recipe, stock_tokenizer):
    from prove.decode import Decoder

    generated = pipeline[0]
    _, run_dir, base = recipe
    assert generated.output_dir == run_dir / "self-distill" / "dataset" and generated.global_step == 0
    settings = json.loads((run_dir / "self-distill" / "generation.json").read_text())
    assert settings["complete"] and settings["method"] == "ar" and settings["proposer"] == str(base)
    rows = [
        json.loads(x)
        for x in (run_dir / "self-distill" / "shards" / "part-00000.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 12 and {r["id"].split("-")[0] for r in rows} == {"arith", "lists"}
    dec = Decoder(str(base), method="ar")
    first = rows[0]
    assert dec.generate(first["prompt_ids"], max_new_tokens=24).token_ids == first["response_ids"]
    assert not (run_dir / "self-distill" / "config.json").exists()  # nothing was trained


def test_mars_full_finetuning_adds_a_trained_mask_row_and_keeps_the_contract(
    pipeline, recipe, stock_tokenizer
):
    from prove.common.checkpoint import read_prove_json
    from transformers import AutoTokenizer

    mars = pipeline[1]
    _, run_dir, _ = recipe
    assert mars.output_dir == run_dir / "mars" and mars.global_step == 3
    meta = read_prove_json(mars.output_dir)
    tok = AutoTokenizer.from_pretrained(mars.output_dir)
    v = len(stock_tokenizer)
    assert (
        meta.stage == "mars"
        and meta.block_size == 8
        and meta.mask_token_id == v == tok.convert_tokens_to_ids("<|mask|>")
    )
    emb, head = _embeddings(mars.output_dir)
    assert emb.shape[0] == v + 1  # no spare row in the base: resized
    assert (run_dir / "mars" / "checkpoint-2" / "optimizer.pt").is_file()  # resumable every save_steps
    config = json.loads((mars.output_dir / "config.json").read_text())
    assert config["vocab_size"] == v + 1 and config["model_type"] == "llama"
    assert config["mask_token_id"] == v  # the contract's copy for vLLM's parallel drafting


def test_lora_trains_the_new_mask_row_and_merges_into_the_contract(pipeline, recipe, stock_tokenizer):
    from prove.common.checkpoint import read_prove_json
    from prove.data.loading import load_model
    from safetensors.torch import load_file

    run, run_dir, base = recipe
    lora = run(
        "stage=mars", "stages.proposer.mars.dir=mars-lora", "max_steps=3", "lr=5e-2"
    )  # the recipe's LoRA
    v = len(stock_tokenizer)
    meta = read_prove_json(lora.output_dir)
    assert meta.mask_token_id == v and meta.block_size == 8 and meta.extra["peft"] == "lora"
    # the recipe's mars: a constant rate, the depth-weighted noisy loss, acceptance scored on the held-out rows
    cfg = meta.extra["training_config"]
    assert (
        cfg["trainer"]["lr_scheduler_type"] == "constant_with_warmup" and cfg["stage"]["depth_decay"] == 0.6
    )
    assert meta.extra["eval"]["output"]["eval_blocks"] > 0
    assert (
        read_prove_json(pipeline[-1].output_dir).extra["peft"] == "none"
    )  # LoRA is the MARS stage's choice only
    adapter = load_file(lora.output_dir / "adapter" / "adapter_model.safetensors")
    deltas = {
        k.split(".token_adapter")[0].rsplit(".", 1)[-1]: t for k, t in adapter.items() if "tokens_delta" in k
    }
    assert set(deltas) == {"embed_tokens", "lm_head"}  # peft adapts the tied head with the embedding
    row = deltas["embed_tokens"][0]  # peft keeps the trained rows' values (named a delta)
    assert torch.equal(deltas["lm_head"][0], row)
    emb, head = _embeddings(lora.output_dir)
    stock = load_model(str(base), "float32").get_input_embeddings().weight.detach()
    assert emb.shape[0] == v + 1
    assert torch.equal(emb[:v], stock)  # LoRA leaves the existing rows alone ...
    # ... and the merged mask row is the trained one, moved away from where the resize started it (the adapter
    # keeps the resized matrix as its base layer)
    start = adapter["base_model.model.model.embed_tokens.token_adapter.base_layer.weight"][v]
    assert torch.equal(emb[v], row) and not torch.allclose(row, start, atol=1e-3)
    assert torch.equal(head, emb)  # the tied head carries the same row
    config = json.loads((lora.output_dir / "config.json").read_text())
    assert config["vocab_size"] == v + 1 and config["mask_token_id"] == v


def test_verifier_is_cut_from_the_base_and_distilled_on_the_mars_outputs(pipeline, recipe):
    from prove.common.checkpoint import read_prove_json
    from prove.decode import Decoder
    from transformers import AutoConfig

    mars, verifier = pipeline[3], pipeline[-1]
    _, run_dir, _ = recipe
    assert verifier.output_dir == run_dir / "verifier-distill" and verifier.global_step == 2
    assert AutoConfig.from_pretrained(verifier.output_dir).num_hidden_layers == 1 < BASE_LAYERS
    meta = read_prove_json(verifier.output_dir)
    # the last round's proposer, not round 1's
    assert meta.stage == "distill" and meta.extra["distilled_from"] == str(run_dir / "round-2" / "mars")
    assert meta.extra["generation"]["method"] == "ar" and meta.extra["generation"]["num_prompts"] == 6
    dec = Decoder(str(mars.output_dir), method="prove", verifier=str(verifier.output_dir), theta=0.1)
    out = dec.generate([{"role": "user", "content": "Reverse the list [3, 8, 1]."}], max_new_tokens=16)
    assert 1 <= len(out.token_ids) <= 16 and out.stats.cycles >= 1


def _generation(folder):
    return json.loads((folder / "generation.json").read_text())


def test_round_two_relabels_unread_prompts_with_round_ones_proposer_and_continues_mars(pipeline, recipe):
    """Round 2: its own folder, round 1's MARS model's greedy outputs for prompts round 1 did not read, then MARS
    continued from round 1's model with its own acceptance curve (fails if the round re-reads round 1's prompts,
    relabels with the base, starts MARS from the base, or writes over round 1's folders)."""
    from prove.common.checkpoint import read_prove_json
    from prove.decode import Decoder

    generated, mars, relabelled, mars2, _ = pipeline
    _, run_dir, _ = recipe
    first, second = _generation(run_dir / "self-distill"), _generation(run_dir / "round-2" / "self-distill")
    assert relabelled.output_dir == run_dir / "round-2" / "self-distill" / "dataset"
    assert len(first["prompt_ids"]) == 12 and len(second["prompt_ids"]) == 6
    assert not set(first["prompt_ids"]) & set(second["prompt_ids"])
    assert second["proposer"] == str(run_dir / "mars") and second["exclude_from"] == [
        str(run_dir / "self-distill")
    ]
    row = json.loads(
        (run_dir / "round-2" / "self-distill" / "shards" / "part-00000.jsonl").read_text().splitlines()[0]
    )
    dec = Decoder(str(mars.output_dir), method="ar")
    assert dec.generate(row["prompt_ids"], max_new_tokens=24).token_ids == row["response_ids"]
    assert mars2.output_dir == run_dir / "round-2" / "mars" and mars2.global_step == 3
    meta = read_prove_json(mars2.output_dir)
    cfg = meta.extra["training_config"]
    assert cfg["stage"]["init_from"] == str(run_dir / "mars")
    assert cfg["data"]["path"] == str(run_dir / "round-2" / "self-distill" / "dataset")
    assert meta.extra["eval"]["output"]["eval_blocks"] > 0  # the round's own held-out acceptance
    assert (
        read_prove_json(mars.output_dir).extra["training_config"]["trainer"]["max_steps"] == 3
    )  # round 1 kept


def test_a_rerun_skips_finished_rounds_and_a_kill_inside_round_two_resumes_there(pipeline, recipe, caplog):
    """The whole command again: every finished stage skipped, round 2's relabelling reused untouched; then round
    2's MARS as a kill after step 2 leaves it (no prove.json, its newest checkpoint-2): the same command skips round
    1 and resumes round 2 from step 2 (fails if a finished round retrains, the relabelling regenerates, or the kill
    restarts round 2 from its first step)."""
    import shutil

    run, run_dir, _ = recipe
    shards = run_dir / "round-2" / "self-distill" / "shards" / "part-00000.jsonl"
    before = shards.stat().st_mtime_ns
    again = [run(*step) for step in STEPS]
    assert [r.skipped for r in again] == [
        False,
        True,
        False,
        True,
        True,
    ]  # the relabelling: no prove.json ...
    assert shards.stat().st_mtime_ns == before  # ... and reused, not regenerated
    mars2 = run_dir / "round-2" / "mars"
    (mars2 / "prove.json").unlink()
    for ckpt in mars2.glob("checkpoint-*"):
        if int(ckpt.name.split("-")[1]) > 2:
            shutil.rmtree(ckpt)
    with caplog.at_level(logging.INFO, logger="prove.train.pipeline"):
        resumed = [run(*step) for step in STEPS]
    assert [r.skipped for r in resumed] == [False, True, False, False, True]
    assert resumed[3].global_step == 3
    assert f"resuming from {mars2 / 'checkpoint-2'}" in caplog.text  # not from its first step


@pytest.mark.parametrize(
    ("extra", "elsewhere", "match"),
    [
        # more rounds than unread prompts: 12 + 4 × 10 > the 48 generated, refused before round 1 generates
        (
            ("stage=distill", "stage.role=proposer", "rounds.count=5", "rounds.num_prompts=10"),
            False,
            "rounds.count",
        ),
        # a round whose proposer is not trained (a run folder without round 1)
        (("stage=distill", "stage.role=proposer", "round=2"), True, "round 1's proposer"),
        (("stage=mars", "round=2"), True, "round 1's proposer"),
        (("stage=mars", "round=3"), False, "rounds.count=2 rounds"),  # past the recipe's rounds
        (("stage=distill", "round=2"), False, "two stages"),  # the verifier has no rounds
    ],
)
def test_bad_rounds_are_an_error_at_start(pipeline, recipe, tmp_path, extra, elsewhere, match):
    """Each refused with a line naming the fix before anything runs (fails if a round starts without its proposer,
    round 1 reads the prompts the later rounds need, or a round outside 1..rounds.count trains)."""
    run, run_dir, _ = recipe
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(ValueError, match=match):
        run(*extra, run_dir=tmp_path / "run" if elsewhere else None)
    assert sorted(p.name for p in run_dir.iterdir()) == before and not (tmp_path / "run").exists()

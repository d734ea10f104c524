"""recipes/smollm2-135m.yaml end to end on a tiny random Llama (SmolLM2's architecture) read from a GGUF file written
in-process: the self-distillation set, MARS (full fine-tuning, and LoRA with the trainable <|mask|> row), the
verifier cut from the base and distilled, then ProVe decoding — the recipe's own commands with a few steps."""

from __future__ import annotations

import json

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
    ]

    def run(*extra: str):
        return train(train_config([*common, *extra]))

    yield run, tmp / "run", base
    mp.undo()


@pytest.fixture(scope="module")
def pipeline(recipe):
    """Steps 1–3 of the recipe's header: self-distillation set, MARS (full FT), the cut verifier distilled."""
    run, run_dir, _ = recipe
    generated = run("stage=distill", "stage.role=proposer")
    mars = run("stage=mars", "peft.kind=none", "max_steps=3", "lr=1e-3")  # full fine-tuning
    verifier = run("stage=distill", "max_steps=2")
    return generated, mars, verifier


def _embeddings(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()


def test_self_distillation_set_is_the_bases_own_greedy_output(pipeline, recipe, stock_tokenizer):
    from prove.decode import Decoder

    generated, _, _ = pipeline
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
    from prove.decode.checkpoint import read_prove_json
    from transformers import AutoTokenizer

    _, mars, _ = pipeline
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
    from prove.data.loading import load_model
    from prove.decode.checkpoint import read_prove_json
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
        read_prove_json(pipeline[2].output_dir).extra["peft"] == "none"
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
    from prove.decode import Decoder
    from prove.decode.checkpoint import read_prove_json
    from transformers import AutoConfig

    _, mars, verifier = pipeline
    _, run_dir, _ = recipe
    assert verifier.output_dir == run_dir / "verifier-distill" and verifier.global_step == 2
    assert AutoConfig.from_pretrained(verifier.output_dir).num_hidden_layers == 1 < BASE_LAYERS
    meta = read_prove_json(verifier.output_dir)
    assert meta.stage == "distill" and meta.extra["distilled_from"] == str(run_dir / "mars")
    assert meta.extra["generation"]["method"] == "ar" and meta.extra["generation"]["num_prompts"] == 6
    dec = Decoder(str(mars.output_dir), method="prove", verifier=str(verifier.output_dir), theta=0.1)
    out = dec.generate([{"role": "user", "content": "Reverse the list [3, 8, 1]."}], max_new_tokens=16)
    assert 1 <= len(out.token_ids) <= 16 and out.stats.cycles >= 1

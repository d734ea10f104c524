"""Bad input is a ValueError that names the fix, raised before any training step."""

from __future__ import annotations

import json

import pytest
from prove.train.pipeline import train

from tests.train.helpers import tiny_overrides, train_config, write_checkpoint


def _hf_dir(tmp_path, tokenizer, qwen2_factory, name="base"):
    return write_checkpoint(
        tmp_path / name, qwen2_factory(len(tokenizer), eos_token_id=tokenizer.eos_token_id), tokenizer
    )


def test_missing_dataset_path(tmp_path):
    with pytest.raises(ValueError, match="data.path"):
        train(train_config(tiny_overrides(tmp_path, tmp_path / "nowhere" / "train.jsonl")))


def test_dataset_without_usable_rows(tmp_path, tokenizer, qwen2_factory):
    data = tmp_path / "bad.jsonl"
    rows = [{"messages": [{"role": "user", "content": "hi"}]}, {"messages": []}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = _hf_dir(tmp_path, tokenizer, qwen2_factory)
    over = tiny_overrides(tmp_path, data, model="hf", **{"model.name_or_path": str(base)})
    with pytest.raises(ValueError, match="no usable rows"):
        train(train_config(over))


def test_tokenizer_without_chat_template(tmp_path, stock_tokenizer, qwen2_factory, arithmetic_jsonl):
    import copy

    tok = copy.deepcopy(stock_tokenizer)
    tok.chat_template = None
    base = _hf_dir(tmp_path, tok, qwen2_factory)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    over = tiny_overrides(tmp_path, arithmetic_jsonl, model="hf", **{"model.name_or_path": str(base)})
    with pytest.raises(ValueError, match="no chat template.*data.chat_template=chatml"):
        train(train_config(over))


def test_mars_before_sft(tmp_path, arithmetic_jsonl):
    with pytest.raises(ValueError, match="run stage=sft first"):
        train(train_config(tiny_overrides(tmp_path, arithmetic_jsonl, stage="mars")))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"block_size": 0}, "block_size=0.*K must be"),
        ({"block_size": 200, "max_len": 128}, "exceeds max_len"),
    ],
)
def test_bad_block_size(tmp_path, arithmetic_jsonl, kw, match):
    with pytest.raises(ValueError, match=match):
        train_config(tiny_overrides(tmp_path, arithmetic_jsonl, stage="mars", **kw))


@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3", "paged_attention"])
def test_mars_refuses_attention_that_ignores_its_block_mask(impl):
    with pytest.raises(
        ValueError, match=f"attn_implementation='{impl}' ignores the 4D block mask.*sdpa.*flex_attention"
    ):
        train_config(["stage=mars", f"model.attn_implementation={impl}"])
    assert train_config(
        ["stage=sft", f"model.attn_implementation={impl}"]
    )  # SFT's causal mask is a padding mask
    for ok in ("sdpa", "flex_attention", "eager"):
        train_config(["stage=mars", f"model.attn_implementation={ok}"])


def test_cpu_threads_per_process_from_the_nodes_cores():
    from prove.train.threads import cpu_threads, offloads_optimizer, rank_threads

    assert rank_threads(96, 8) == 12 and rank_threads(2, 8) == 1 and rank_threads(7, 2) == 3
    offload = train_config(["deepspeed=zero3_offload_optimizer"])
    assert offloads_optimizer(offload.deepspeed) and offloads_optimizer(
        train_config(["deepspeed=zero3_offload"]).deepspeed
    )
    assert not offloads_optimizer(train_config(["deepspeed=zero3"]).deepspeed) and not offloads_optimizer(
        None
    )
    # torchrun's OMP_NUM_THREADS=1 is replaced for an offloaded optimizer: cores / processes on this node
    assert cpu_threads(offload, {"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "1"}, cores=96) == 12
    assert (
        cpu_threads(train_config(["deepspeed=zero3"]), {"LOCAL_WORLD_SIZE": "8"}, cores=96) is None
    )  # left alone
    assert cpu_threads(train_config(["deepspeed=zero3", "cpu_threads=4"]), {}, cores=96) == 4  # explicit wins
    # 0: sized whatever the optimizer (a model trained on the CPU itself), not the environment's 1
    assert cpu_threads(train_config(["cpu_threads=0"]), {"OMP_NUM_THREADS": "1"}, cores=2) == 2
    assert (
        cpu_threads(train_config(["deepspeed=zero3", "cpu_threads=0"]), {"LOCAL_WORLD_SIZE": "2"}, cores=8)
        == 4
    )
    with pytest.raises(ValueError, match="cpu_threads=-1"):
        train_config(["cpu_threads=-1"])


def test_an_offloaded_cpu_adam_that_cannot_build_is_refused_in_one_line():
    """zero3_offload_optimizer (the 32B recipe's) builds DeepSpeed's CPU Adam at start: a node without a compiler gets
    one ValueError (prove-train prints it as one line) naming both ways out, not a compiler's traceback once the
    model is sharded; torch_adam=true and an optimizer on the GPU never build it."""
    import subprocess

    from prove.train.threads import require_cpu_adam

    def cannot_build():
        raise subprocess.CalledProcessError(1, ["ninja", "-v"], output="c++: command not found")

    calls: list[int] = []
    offload = train_config(["deepspeed=zero3_offload_optimizer"]).deepspeed
    with pytest.raises(
        ValueError, match=r"CPU Adam, which does not build here \(CalledProcessError: .*ninja"
    ) as e:
        require_cpu_adam(offload, load=cannot_build)
    assert "torch_adam=true" in str(e.value) and "\n" not in str(e.value)
    require_cpu_adam(offload, load=lambda: calls.append(1))  # builds: no error
    assert calls == [1]
    torch_adam = train_config(
        ["deepspeed=zero3_offload_optimizer", "deepspeed.optimizer.params.torch_adam=true"]
    )
    require_cpu_adam(torch_adam.deepspeed, load=cannot_build)
    require_cpu_adam(train_config(["deepspeed=zero3"]).deepspeed, load=cannot_build)

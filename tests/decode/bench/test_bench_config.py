"""prove-bench, BenchConfig through Hydra: list overrides, hf_compare's checks."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from prove.decode.bench.config import BenchConfig


def test_config_composes_with_list_overrides():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.bench.config import register_configs

    register_configs()
    with initialize_config_module(config_module="prove.conf.decode", version_base=None):
        cfg = compose(
            "bench",
            ["model=m", "prompts=p.jsonl", "theta=[0.05,0.1]", "methods=[ar,prove]", "tau=0.9",
             "method_params={prove:{block_size:[2,4]}}"],
        )  # fmt: skip
        bad = pytest.raises(ConfigCompositionException, match="'thetta'")
        with bad:
            compose("bench", ["model=m", "prompts=p", "thetta=0.1"])
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, BenchConfig)
    assert config.theta == [0.05, 0.1] and config.tau == 0.9 and config.methods == ["ar", "prove"]
    assert config.method_params == {"prove": {"block_size": [2, 4]}}
    assert config.sweeps() == {
        "theta": [0.05, 0.1], "tau": 0.9, "block_size": None, "k": None, "draft_threshold": None, "fuse": None,
        "fuse_groups": None, "fast": None, "compile": None, "pad_widths": None, "temperature": None, "top_p": None,
        "top_k": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match="max_new_tokens"):
        BenchConfig(model="m", prompts="p", max_new_tokens=0)


def test_hf_compare_config_checks():
    cfg = BenchConfig(hf_compare="tiny")
    assert cfg.methods == ["ar", "sd"] and cfg.model is None
    with pytest.raises(ValueError, match="not a known shape"):
        BenchConfig(hf_compare="qwen9")
    with pytest.raises(ValueError, match="drop model="):
        BenchConfig(hf_compare="tiny", model="m")
    with pytest.raises(ValueError, match="drop \\['prove'\\]"):
        BenchConfig(hf_compare="tiny", methods=["ar", "prove"])
    with pytest.raises(ValueError, match="pass model="):
        BenchConfig(prompts="p")

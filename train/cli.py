"""``prove-train``: the Hydra entry point of the training pipeline (a thin shell over :func:`prove.train.pipeline.train`).

prove-train recipe=tiny stage=sft
prove-train recipe=tiny stage=mars
torchrun --nproc_per_node 8 -m prove.train.cli recipe=qwen2.5-32b stage=mars
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from prove.decode.errors import exit_on_sigterm, exit_on_user_error, reject_unknown_keys
from prove.train.config import TrainConfig, register_configs

register_configs()


def to_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as dataclasses (runs the cross-field checks in ``__post_init__``)."""
    reject_unknown_keys(cfg, "prove-train")
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig)
    return obj


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    from prove.train.pipeline import train

    with exit_on_sigterm(), exit_on_user_error("prove-train"):  # a killed relabel stops its vLLM engine
        train(to_config(cfg))


def main() -> None:
    _main()


if __name__ == "__main__":
    main()

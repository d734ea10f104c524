"""``prove-train``: the Hydra entry point of the training pipeline (a thin shell over :func:`prove.train.pipeline.train`).

prove-train recipe=tiny stage=sft
prove-train recipe=tiny stage=mars
torchrun --nproc_per_node 8 -m prove.train.cli recipe=qwen2.5-32b stage=mars
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from prove.common.errors import exit_on_sigterm, exit_on_user_error, reject_unknown_keys
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
        try:
            train(to_config(cfg))
        finally:
            close_process_group()


def close_process_group() -> None:
    """Tear down the torch.distributed group the run's Trainer set up, before the interpreter does. Left to exit,
    gloo's threads can be destroyed while still joinable, and a rank of a finished run aborts ("terminate called
    without an active exception", SIGABRT). torchrun then reports the whole run as failed. Not collective: each rank
    closes its own end."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    _main()


if __name__ == "__main__":
    main()

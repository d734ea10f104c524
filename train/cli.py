"""``prove-train``: the Hydra entry point of the training pipeline (a thin shell over :func:`prove.train.pipeline.train`).

    prove-train recipe=tiny stage=sft
    prove-train recipe=tiny stage=mars
    torchrun --nproc_per_node 8 -m prove.train.cli recipe=qwen2.5-32b stage=mars
"""

from __future__ import annotations

import dataclasses

import hydra
from omegaconf import DictConfig, OmegaConf
from prove.decode.errors import exit_on_user_error
from prove.train.config import TrainConfig, register_configs

register_configs()


def to_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as dataclasses (runs the cross-field checks in ``__post_init__``)."""
    _reject_unknown_keys(cfg)
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, TrainConfig)
    return obj


def _reject_unknown_keys(node: DictConfig, path: str = "") -> None:
    """``+group.typo=1`` forces a key into a structured node, and ``to_object`` would drop it silently."""
    kind = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(kind):
        unknown = set(node.keys()) - {f.name for f in dataclasses.fields(kind)} - {"hydra"}
        if unknown:
            names = sorted(f"{path}{k!s}" for k in unknown)
            raise ValueError(f"unknown config key(s) {names}: check the spelling (`prove-train --cfg job` prints every key)")
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                _reject_unknown_keys(child, f"{path}{key!s}.")


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    from prove.train.pipeline import train

    with exit_on_user_error("prove-train"):
        train(to_config(cfg))


def main() -> None:
    _main()


if __name__ == "__main__":
    main()

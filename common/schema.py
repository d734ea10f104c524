"""The structured-config helper both Hydra CLIs (``prove-decode`` / ``prove-bench`` / ``prove-serve`` and
``prove-train``) build their ConfigStore schema with. omegaconf is imported on call, so importing this module
costs nothing."""

from __future__ import annotations

from typing import Any


def schema_node(cls: type) -> Any:
    """``cls``'s structured config for Hydra's ConfigStore, every ``engine_args`` in it (vLLM's free-form engine
    arguments, ``VllmOptions.engine_args``) open to new keys: ``vllm.engine_args.KEY=VALUE`` composes as written,
    with or without Hydra's ``+`` (under struct mode an empty typed dict refuses a key it lacks). Every other key of
    the schema stays closed: a misspelt one still fails."""
    from omegaconf import DictConfig, OmegaConf

    def walk(node: DictConfig) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                if key == "engine_args":
                    OmegaConf.set_struct(child, False)
                else:
                    walk(child)

    root = OmegaConf.structured(cls)
    walk(root)
    return root

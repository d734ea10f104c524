"""``prove-decode``: decode a prompt file with one method (a thin Hydra shell over ``prompts.run``).

    prove-decode model=PATH method=prove verifier=PATH theta=0.1 block_size=16 \\
        prompts=prompts.jsonl output=out.jsonl max_new_tokens=256

Every key of ``prove.decode.config.DecodeConfig`` is overridable; ``method=NAME`` also loads
``conf/method/NAME.yaml`` (that method's defaults). ``prove-decode --cfg job`` prints the composed config.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from prove.decode.config import DecodeConfig, register_configs
from prove.decode.errors import exit_on_user_error, reject_unknown_keys

register_configs()


@hydra.main(version_base=None, config_path="pkg://prove.conf.decode", config_name="decode")
def main(cfg: DictConfig) -> None:
    from prove.decode.prompts import run

    with exit_on_user_error("prove-decode"):
        reject_unknown_keys(cfg, "prove-decode")
        config: DecodeConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]  # runs __post_init__ checks
        out = run(config)
    print(out)


if __name__ == "__main__":
    main()

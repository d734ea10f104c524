"""``prove-bench``: every method over one prompt set, AR first (a thin Hydra shell over ``prove.decode.bench.run.run_bench``).

    prove-bench model=PATH verifier=PATH draft=PATH prompts=test.jsonl \\
        methods=[ar,mars,prove,prove-lossless,sd] theta=[0.05,0.1,0.3] n_prompts=50

Every key of ``prove.decode.bench.config.BenchConfig`` is overridable; ``theta`` / ``tau`` / ``block_size`` / ``k``
take a list (one row per value). Writes ``output_dir``/bench.json, bench.md (printed) and PNG plots.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf
from prove.decode.bench.config import BenchConfig, register_configs
from prove.decode.errors import exit_on_user_error, reject_unknown_keys

register_configs()


@hydra.main(version_base=None, config_path="pkg://prove.conf.decode", config_name="bench")
def main(cfg: DictConfig) -> None:
    from pathlib import Path

    from prove.decode.bench.run import run_bench

    with exit_on_user_error("prove-bench"):
        reject_unknown_keys(cfg, "prove-bench")
        config: BenchConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]  # runs __post_init__ checks
        report = run_bench(config)
    out = Path(config.output_dir)
    print((out / "bench.md").read_text())
    print(
        f"wrote {out / 'bench.json'}, {out / 'bench.md'}"
        + "".join(f", {p}" for p in report["plots"].values())
    )


if __name__ == "__main__":
    main()

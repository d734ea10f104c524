"""``prove-bench``: every method over one prompt set, AR first (a thin Hydra shell over ``prove.decode.bench.run.run_bench``).

    prove-bench model=PATH verifier=PATH draft=PATH prompts=test.jsonl \\
        methods=[ar,mars,prove,prove-lossless,sd] theta=[0.05,0.1,0.3] n_prompts=50

Every key of ``prove.decode.bench.config.BenchConfig`` is overridable; ``theta`` / ``tau`` / ``block_size`` / ``k``
take a list (one row per value). Writes ``output_dir``/bench.json, bench.md (printed) and PNG plots.
"""

from __future__ import annotations

from pathlib import Path

from prove.common.errors import hydra_cli
from prove.decode.bench.config import BenchConfig, register_configs


def run(config: BenchConfig) -> None:
    from prove.decode.bench.run import run_bench

    report = run_bench(config)
    out = Path(config.output_dir)
    print((out / "bench.md").read_text())
    print(
        f"wrote {out / 'bench.json'}, {out / 'bench.md'}"
        + "".join(f", {p}" for p in report["plots"].values())
    )


def main() -> None:
    register_configs()
    hydra_cli("prove-bench", "prove.conf.decode", "bench", run)()


if __name__ == "__main__":
    main()

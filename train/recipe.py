"""A recipe's training pipeline: its ``steps`` with the on-policy rounds written out, and the walk over them that
``make train`` runs — one prove-train run a step, in order, stopping at the first that fails.

    python -m prove.train.recipe recipe=smollm2-135m            # one line of overrides a run, in order
    python -m prove.train.recipe recipe=smollm2-135m --proposer # the last round's MARS model (make bench-real)
    python -m prove.train.recipe recipe=smollm2-135m --base     # the base it was trained from (bench-real's quality)
    python -m prove.train.recipe --run --launch .venv/bin/prove-train recipe=smollm2-chat   # make train's walk
    python -m prove.train.recipe --run --dry-run --launch prove-train recipe=tiny           # the runs, not run

A run of consecutive ``steps`` entries holding ``{round}`` repeats, as a group, for each round 2..``rounds.count``
(round r's relabelling needs round r − 1's MARS model). Every run gets the overrides given here too (``make
train ARGS=…``), after the step's own. A rerun of the same walk is the resume: each finished stage skips itself
(its ``prove.json``) and the unfinished one resumes from its newest checkpoint.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence

from prove.train.config import round_dir

ROUND = "{round}"


def expand(steps: list[str], count: int) -> list[str]:
    """``steps`` with each group of consecutive ``{round}`` entries repeated for rounds 2..count, in order."""
    out: list[str] = []
    group: list[str] = []
    for step in [*steps, ""]:  # the sentinel flushes a group at the end
        if ROUND in step:
            group.append(step)
            continue
        for r in range(2, count + 1):
            out.extend(s.replace(ROUND, str(r)) for s in group)
        group = []
        if step:
            out.append(step)
    return out


def run_lines(launch: str, overrides: Sequence[str], steps: Sequence[str]) -> list[str]:
    """The shell command of each step: ``launch`` (a command prefix: a launcher, env assignments, a setup command
    joined by ``&&``) + the ``recipe=`` overrides + the step's overrides + every other given override."""
    recipe = [o for o in overrides if o.startswith("recipe=")]
    rest = [o for o in overrides if not o.startswith("recipe=")]
    return [f"{launch.strip()} {shlex.join([*recipe, *shlex.split(step), *rest])}" for step in steps]


def walk(lines: Sequence[str], execute: Callable[[str], int] | None = None) -> int:
    """Run ``lines`` in order through the shell (``execute``), stopping at the first that fails; its status is
    returned after one line that names the step and how to resume."""
    execute = execute or (lambda line: subprocess.run(line, shell=True).returncode)
    for i, line in enumerate(lines, 1):
        print(f"make train: step {i}/{len(lines)}: {line}", file=sys.stderr, flush=True)
        status = execute(line)
        if status != 0:
            print(
                f"make train: step {i}/{len(lines)} failed (exit {status}); steps {i + 1}..{len(lines)} not run. "
                "Fix its error and rerun the same command: finished steps skip themselves and this one resumes "
                "from its newest checkpoint.",
                file=sys.stderr,
            )
            return status
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="prove-train overrides, e.g. recipe=smollm2-135m")
    parser.add_argument("--proposer", action="store_true", help="print the last round's MARS model instead")
    parser.add_argument(
        "--base", action="store_true", help="print the base model (model.name_or_path) instead"
    )
    parser.add_argument(
        "--run", action="store_true", help="run each step with --launch, in order (make train)"
    )
    parser.add_argument("--launch", default="prove-train", help="--run's command prefix of every step")
    parser.add_argument("--dry-run", action="store_true", help="--run: print each step's command, run none")
    args = parser.parse_intermixed_args(argv)
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from prove.common.errors import exit_on_user_error
    from prove.train.config import register_configs

    register_configs()
    with exit_on_user_error("prove.train.recipe"), initialize_config_module("prove.conf", version_base="1.3"):
        try:
            cfg = compose(config_name="train", overrides=[*args.overrides, "stage=mars"])
        except (
            HydraException
        ) as e:  # a misspelt key or a missing recipe: one line, not a traceback inside make
            raise ValueError(" ".join(str(e).split())) from None
    count = int(cfg.rounds.count)
    if args.proposer:
        print(f"{round_dir(str(cfg.run_dir), count)}/mars")
        return
    if args.base:
        try:
            print(cfg.model.name_or_path)
        except Exception as e:  # the recipe's GGUF not installed: one line, not a traceback inside make
            sys.exit(f"prove.train.recipe --base: {str(e).splitlines()[0]}")
        return
    steps = expand([str(s) for s in OmegaConf.to_container(cfg.steps)], count)  # type: ignore[union-attr]
    if not steps:
        sys.exit(
            f"prove.train.recipe: {' '.join(args.overrides)} composes no `steps`: give the recipe a steps list"
        )
    if args.run:
        lines = run_lines(args.launch, args.overrides, steps)
        if args.dry_run:
            print("\n".join(lines))
            return
        sys.exit(walk(lines))
    print("\n".join(" ".join(shlex.split(step)) for step in steps))


if __name__ == "__main__":
    main()

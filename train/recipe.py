"""``make train``'s runs for a recipe: its ``steps`` with the on-policy rounds written out, one prove-train run a line.

    python -m prove.train.recipe recipe=smollm2-135m            # one line of overrides a run, in order
    python -m prove.train.recipe recipe=smollm2-135m --proposer # the last round's MARS model (make bench-real)
    python -m prove.train.recipe recipe=smollm2-135m --base     # the base it was trained from (bench-real's quality)

A run of consecutive ``steps`` entries holding ``{round}`` repeats, as a group, for each round 2..``rounds.count``
(round r's relabelling needs round r − 1's MARS model). ``--joiner`` replaces the spaces inside a line, so that
make can split the lines into words (``$(shell)`` turns newlines into spaces).
"""

from __future__ import annotations

import argparse
import sys

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="prove-train overrides, e.g. recipe=smollm2-135m")
    parser.add_argument("--proposer", action="store_true", help="print the last round's MARS model instead")
    parser.add_argument(
        "--base", action="store_true", help="print the base model (model.name_or_path) instead"
    )
    parser.add_argument("--joiner", default=" ", help="what joins a line's overrides (make: a non-space)")
    args = parser.parse_intermixed_args(argv)
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.train.config import register_configs

    register_configs()
    with initialize_config_module(config_module="prove.conf", version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*args.overrides, "stage=mars"])
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
    steps = [str(s) for s in OmegaConf.to_container(cfg.steps)]  # type: ignore[union-attr]
    for line in expand(steps, count):
        if args.joiner != " " and args.joiner in line:
            sys.exit(
                f"prove.train.recipe: the step {line!r} holds the joiner {args.joiner!r}: pick another --joiner"
            )
        print(args.joiner.join(line.split()))


if __name__ == "__main__":
    main()

"""On-policy rounds of the proposer (``rounds``, docs/training.md "On-policy rounds").

MARS round 1 learns the base model's own greedy responses; once it proposes, its blocks drift from what it would
itself say, and a round on its own greedy outputs (on-policy labels) corrects that. Round r ≥ 2 is two ordinary
stages, each resumable and skipped when finished like any other (:mod:`prove.train.rerun`):

- ``round=r stage=distill stage.role=proposer``: round r − 1's MARS model answers ``rounds.num_prompts`` prompts
  greedily (stage distill's generation, the recipe's backend and settings), leaving out every prompt an earlier
  round's set read (``distill.exclude_from``: their ``generation.json`` ``prompt_ids``) -> ``<run_dir>/round-r/self-distill``;
- ``round=r stage=mars``: MARS continued from round r − 1's model on that set for ``rounds.max_steps``
  -> ``<run_dir>/round-r/mars``, with its own held-out acceptance curve (``eval``).

:func:`for_round` turns the recipe's stage config into round r's (round 1: unchanged, but round 1's relabelling
keeps the later rounds' prompts unread: ``distill.reserve_prompts``), and refuses at start a round whose
proposer is not trained yet or a round outside ``1..rounds.count``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prove.train.config import Role, Stage, TrainConfig, round_dir

SET = "self-distill"
"""A round's relabelled set, inside its folder."""
MARS = "mars"
"""A round's MARS model, inside its folder."""


def is_relabel(cfg: TrainConfig) -> bool:
    """The stage is a round's relabelling: distill for the proposer, generating only."""
    return cfg.stage.name == Stage.distill and cfg.stage.role == Role.proposer and not cfg.distill.train


def proposer_of(cfg: TrainConfig, r: int) -> Path:
    """Round r's MARS model."""
    return Path(round_dir(cfg.run_dir, r)) / MARS


def for_round(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as round ``cfg.round`` trains it; a ValueError naming the fix for a round that cannot run."""
    r, rounds = cfg.round, cfg.rounds
    if not 1 <= r <= rounds.count:
        raise ValueError(
            f"round={r}: the recipe has rounds.count={rounds.count} rounds (1..{rounds.count}); raise "
            f"rounds.count={r} to train round {r}"
        )
    if r == 1:
        if is_relabel(cfg) and rounds.count > 1:  # leave the later rounds their unread prompts
            reserve = (rounds.count - 1) * rounds.num_prompts
            return dataclasses.replace(cfg, distill=dataclasses.replace(cfg.distill, reserve_prompts=reserve))
        return cfg
    if not (is_relabel(cfg) or (cfg.stage.name == Stage.mars and cfg.stage.role == Role.proposer)):
        raise ValueError(
            f"round={r} names an on-policy round, which has two stages: stage=distill stage.role=proposer "
            f"(the relabelling) and stage=mars; drop round={r} for stage={cfg.stage.name} "
            f"stage.role={cfg.stage.role}"
        )
    previous = proposer_of(cfg, r - 1)
    if not (previous / "prove.json").is_file():
        raise ValueError(
            f"round {r} starts from round {r - 1}'s proposer, and {previous} holds no finished model (no "
            f"prove.json): train it first (prove-train stage=mars{'' if r == 2 else f' round={r - 1}'}), "
            "or run make train, which runs the rounds in order"
        )
    here = Path(round_dir(cfg.run_dir, r))
    relabelled = here / SET
    if is_relabel(cfg):
        earlier = [cfg.distill.generated_dir] + [f"{round_dir(cfg.run_dir, i)}/{SET}" for i in range(2, r)]
        distill = dataclasses.replace(
            cfg.distill,
            proposer=str(previous),
            num_prompts=rounds.num_prompts,
            exclude_from=earlier,
            reserve_prompts=(rounds.count - r) * rounds.num_prompts,
            generated_dir=str(relabelled),
        )
        trainer = dataclasses.replace(cfg.trainer, output_dir=str(relabelled))
        return dataclasses.replace(cfg, distill=distill, trainer=trainer, output_dir=str(relabelled))
    if not (relabelled / "dataset").is_dir():
        raise ValueError(
            f"round {r}'s MARS trains on {relabelled}/dataset, which is not generated yet: run "
            f"prove-train stage=distill stage.role=proposer round={r} first"
        )
    out = str(here / MARS)
    trainer = dataclasses.replace(
        cfg.trainer,
        output_dir=out,
        max_steps=rounds.max_steps,
        max_minutes=cfg.trainer.max_minutes if rounds.max_minutes is None else rounds.max_minutes,
    )
    return dataclasses.replace(
        cfg,
        trainer=trainer,
        output_dir=out,
        max_steps=rounds.max_steps,
        stage=dataclasses.replace(cfg.stage, init_from=str(previous)),
        data=dataclasses.replace(cfg.data, path=str(relabelled / "dataset")),
    )

"""Experiment tracking for a stage: wandb (project / run names from the config) or nothing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from prove.train.config import LoggerKind, TrainConfig, config_dict, run_label


@dataclass
class Tracker:
    """What the Trainer reports to (``report_to``) and how to close it."""

    report_to: list[str] = field(default_factory=list)
    run: Any = None

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def open_logger(cfg: TrainConfig) -> Tracker:
    """Start a wandb run on the main process (the Trainer's WandbCallback logs into it); ``WANDB_MODE=offline`` works."""
    if cfg.logger.kind == LoggerKind.none:
        return Tracker(report_to=[])
    if int(os.environ.get("RANK", "0")) != 0:
        return Tracker(report_to=[])
    import wandb

    lg = cfg.logger
    run = wandb.init(
        project=lg.project,
        name=run_label(cfg),
        group=lg.group,
        entity=lg.entity,
        tags=list(lg.tags) or None,
        config=config_dict(cfg),
    )
    return Tracker(report_to=["wandb"], run=run)

"""Experiment tracking for a stage: wandb (project / run names from the config) or nothing.

A cluster node without a wandb login must not crash the run at ``wandb.init`` on rank 0 while the other
ranks wait at the first collective: :func:`open_logger` checks for credentials first and, without any,
logs offline (``WANDB_MODE=offline``, ``wandb sync`` later) with a warning.

A stage's wandb run id is kept in its output folder (:data:`RUN_ID_FILE`), so a relaunch of the stage — after a
crash, on another number of nodes — resumes the same run (``resume="allow"``) instead of starting a new one; a
stage trained again from its first step (``force=true``, ``resume=false``) starts a new run.
"""

from __future__ import annotations

import logging
import netrc
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlparse

from prove.train.config import LoggerKind, TrainConfig, config_dict, run_label

log = logging.getLogger(__name__)

LOCAL_MODES = ("offline", "disabled")
"""``WANDB_MODE`` values that never contact the server (no login needed)."""
WandbMode = Literal["online", "offline", "disabled", "shared"]
WANDB_MODES = ("online", "offline", "disabled", "shared")
RUN_ID_FILE = "wandb_run_id"
"""The file in a stage's output folder that holds its wandb run id."""


@dataclass
class Tracker:
    """What the Trainer reports to (``report_to``) and how to close it."""

    report_to: list[str] = field(default_factory=list)
    run: Any = None

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def wandb_has_credentials(
    environ: Mapping[str, str] | None = None, home: str | os.PathLike | None = None
) -> bool:
    """Whether wandb can log in without a prompt: ``WANDB_API_KEY``, an identity-token file, or a netrc entry
    for the wandb host (``wandb login`` writes one to ``~/.netrc``; ``NETRC`` moves it)."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    base = Path(home) if home is not None else Path.home()
    candidates = [Path(env["NETRC"])] if env.get("NETRC") else [base / ".netrc", base / "_netrc"]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            continue
        if entry and entry[2]:
            return True
    return False


def wandb_mode(
    environ: Mapping[str, str] | None = None, home: str | os.PathLike | None = None
) -> tuple[WandbMode, str | None]:
    """``(mode to run wandb in, warning or None)``: ``WANDB_MODE``, or ``offline`` when it would go online
    without credentials."""
    env = os.environ if environ is None else environ
    mode = env.get("WANDB_MODE", "online").strip().lower() or "online"
    mode = "offline" if mode == "dryrun" else mode  # wandb's old name for it
    if mode not in WANDB_MODES:
        raise ValueError(f"WANDB_MODE={mode!r}: use one of {list(WANDB_MODES)} (or logger=none)")
    if mode in LOCAL_MODES or wandb_has_credentials(env, home):
        return cast(WandbMode, mode), None
    return "offline", (
        "logger=wandb with WANDB_MODE=online but no wandb login on this node (no WANDB_API_KEY, no ~/.netrc entry): "
        "logging offline to ./wandb instead (`wandb sync wandb/offline-run-*` later; `wandb login` on the nodes, "
        "or logger=none, to silence this)"
    )


def run_id(output_dir: str | os.PathLike, new: bool = False) -> str:
    """The stage's wandb run id: the one stored in ``output_dir`` (a relaunch continues that run), else a fresh one,
    stored there; ``new``: always a fresh one (the stage starts over)."""
    path = Path(output_dir) / RUN_ID_FILE
    if not new and path.is_file() and (stored := path.read_text().strip()):
        return stored
    fresh = secrets.token_hex(4)  # 8 characters of [0-9a-f], as wandb's own ids
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fresh + "\n")
    return fresh


def open_logger(cfg: TrainConfig, resuming: bool = True) -> Tracker:
    """Start a wandb run on the main process (the Trainer's WandbCallback logs into it).

    Every rank checks that wandb is installed (a clear error on all of them rather than a hang); rank 0 then
    falls back to offline logging when it has no login, and when ``wandb.init`` fails online. ``resuming``: the
    stage continues (a run id stored in its output folder is resumed), else it starts a new run.
    """
    if cfg.logger.kind == LoggerKind.none:
        return Tracker(report_to=[])
    try:
        import wandb
    except ImportError as e:
        raise ValueError(
            "logger=wandb needs the wandb package: pip install wandb, or pass logger=none"
        ) from e
    mode, warning = wandb_mode()  # on every rank: a bad WANDB_MODE fails them all
    if int(os.environ.get("RANK", "0")) != 0:
        return Tracker(report_to=[])
    if warning:
        log.warning(warning)
        os.environ["WANDB_MODE"] = mode  # the Trainer's WandbCallback reads it too
    lg = cfg.logger
    kwargs = dict(
        project=lg.project,
        name=run_label(cfg),
        group=lg.group,
        entity=lg.entity,
        tags=list(lg.tags) or None,
        config=config_dict(cfg),
        id=run_id(cfg.trainer.output_dir, new=not resuming),
        resume="allow",
    )
    try:
        run = wandb.init(mode=mode, **kwargs)
    except Exception as e:  # noqa: BLE001 - any server-side failure: keep training, log locally
        if mode in LOCAL_MODES:
            raise
        log.warning(
            "wandb.init failed online (%s): logging offline to ./wandb instead (`wandb sync` later)", e
        )
        os.environ["WANDB_MODE"] = "offline"
        run = wandb.init(mode="offline", **kwargs)
    return Tracker(report_to=["wandb"], run=run)

"""How the command-line entry points start (:func:`hydra_cli`) and report bad input: one line that names the
fix, exit status 2.

Library code raises ``ValueError`` for input a user can correct (docs/design.md §1: errors say what to change);
the CLIs turn those into ``prove-decode: error: ...`` instead of a stack trace. ``HYDRA_FULL_ERROR=1``
(Hydra's own switch, which users of these Hydra CLIs already know) keeps the full traceback.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def exit_on_user_error(prog: str) -> Iterator[None]:
    try:
        yield
    except ValueError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        print(f"{prog}: (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (``kill``, a scheduler's time limit, ``make`` interrupted) into ``SystemExit(143)`` inside the
    block, so ``finally`` clauses and ``atexit`` handlers run: Python's default action for SIGTERM ends the process
    at once, and an engine process it started (vLLM's ``EngineCore``, which holds the GPU's memory) would outlive
    it. The previous handler comes back when the block ends."""

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def reject_unknown_keys(node: Any, prog: str, path: str = "") -> None:
    """Refuse keys that no dataclass field declares, at any depth of a composed structured config.

    ``+typo=1`` (or ``+group.typo=1``) forces a key into a structured node, and ``OmegaConf.to_object`` would
    drop it silently: ``prove-decode ... +tempreature=0.7`` would decode greedily without a word. Every CLI
    (prove-train, prove-decode, prove-bench, prove-eval) calls this before building its config object.
    """
    from omegaconf import DictConfig, OmegaConf

    kind = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(kind):
        return
    unknown = set(node.keys()) - {f.name for f in dataclasses.fields(kind)} - {"hydra"}
    if unknown:
        names = sorted(f"{path}{k!s}" for k in unknown)
        raise ValueError(
            f"unknown config key(s) {names}: check the spelling (`{prog} --cfg job` prints every key)"
        )
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            reject_unknown_keys(child, prog, f"{path}{key!s}.")


def hydra_cli(
    prog: str, config_module: str, config_name: str, body: Callable[[Any], Any]
) -> Callable[[], None]:
    """The Hydra entry point every prove CLI shares: compose ``config_name`` from the packaged
    ``config_module`` (``pkg://``, so an installed wheel finds it), refuse unknown keys, build the config
    dataclass (its ``__post_init__`` checks run) and call ``body`` with it, a bad value ending as one line
    and exit status 2, and SIGTERM as ``SystemExit`` (:func:`exit_on_sigterm`). The schema must be registered with
    Hydra's ConfigStore before the returned function is called; the YAML sets ``hydra.job.name`` (the log file's name) to ``prog``."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    @hydra.main(version_base=None, config_path=f"pkg://{config_module}", config_name=config_name)
    def main(cfg: DictConfig) -> None:
        with exit_on_sigterm(), exit_on_user_error(prog):
            reject_unknown_keys(cfg, prog)
            body(OmegaConf.to_object(cfg))

    return main

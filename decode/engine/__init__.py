"""The decode engine (docs/design.md §3): one loop (``loop``) over two kinds of cycle — the composed cycle of a
method's proposer, verifier and pure rule on ``ModelRunner``s (``runner``), and the device cycle of its rule twin
(``device``, its cycles by kind ``cycles``; compiled: ``graphs``) — all on the slot cache (``cache``, checked on each model by ``check``); the fused
verify-and-draft cycle (``fused``, its tree ``tree``), the device's pass-cost curve (``pass_cost``) and padded passes
(``padding``)."""

from prove.decode.engine.loop import (
    ComposedCycle,
    Cycle,
    CycleEvent,
    CycleView,
    Models,
    Passes,
    Stats,
    Step,
    Stopper,
    Tally,
    device_sync,
    end_of_turn_ids,
    run,
)
from prove.decode.engine.runner import ModelRunner, tree_attention_bias, tree_local

__all__ = [
    "ComposedCycle",
    "Cycle",
    "CycleEvent",
    "CycleView",
    "ModelRunner",
    "Models",
    "Passes",
    "Stats",
    "Step",
    "Stopper",
    "Tally",
    "device_sync",
    "end_of_turn_ids",
    "run",
    "tree_attention_bias",
    "tree_local",
]

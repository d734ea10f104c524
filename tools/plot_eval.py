"""Curves of stage mars's acceptance while training, several runs on one figure: simulated prove-lossless tokens per
cycle (``eval_tpc_k{K′}``, docs/training.md "Acceptance while training") against optimizer steps and wall minutes.

    python tools/plot_eval.py runs/smollm2-135m/mars-const-hi runs/smollm2-135m/mars-k4 --k 4 \\
        --out outputs/eval-curves/curves.png

A run is a stage folder: its ``prove.json`` (``eval.history``) once finished, else its newest ``checkpoint-N/
trainer_state.json`` (the history so far, for a run still going or cut short). ``--k`` picks K′ (default: each run's
own K, so a K = 4 run and a K = 8 run are each read at their own). Writes the PNG and a Markdown table of each run's
last and best values beside it (``.md``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def history(run: Path) -> tuple[list[dict[str, Any]], int | None]:
    """``(eval logs, trained K)`` of a stage folder: prove.json's eval history, else its newest checkpoint's."""
    from prove.common.checkpoint import read_prove_json

    meta = read_prove_json(run)
    if meta is not None:
        evaluation = (meta.extra or {}).get("eval") or {}
        return list(evaluation.get("history") or []), meta.block_size
    checkpoints = sorted(
        run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1])
    )
    if not checkpoints:
        raise SystemExit(
            f"{run} holds neither prove.json nor checkpoint-N/trainer_state.json: pass a stage folder"
        )
    state = json.loads(checkpoints[-1].read_text())
    logs = [h for h in state.get("log_history", []) if "eval_blocks" in h]
    ks = [int(k.removeprefix("eval_tpc_k")) for k in (logs[-1] if logs else {}) if k.startswith("eval_tpc_k")]
    return logs, max(ks) if ks else None


def curve(logs: list[dict[str, Any]], k: int) -> list[tuple[int, float | None, float]]:
    """``(step, minutes or None, eval_tpc_k{k})`` per eval log that has it."""
    key = f"eval_tpc_k{k}"
    return [(int(h["step"]), h.get("eval_minutes"), float(h[key])) for h in logs if key in h]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/plot_eval.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="stage mars folders (prove.json or checkpoint-N/)")
    p.add_argument("--k", type=int, default=None, help="K′ to plot (default: each run's trained K)")
    p.add_argument("--out", default="outputs/eval-curves/curves.png")
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_min) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    lines = ["| run | K′ | evals | last (step) | best (step) |", "|---|---:|---:|---|---|"]
    for run in map(Path, args.runs):
        logs, trained = history(run)
        k = args.k or trained
        if k is None:
            raise SystemExit(f"{run}: no eval_tpc_k* logged and no block size in prove.json: pass --k")
        points = curve(logs, k)
        if not points:
            raise SystemExit(
                f"{run} logged no eval_tpc_k{k} (eval.rows=0, or K′ above its K): pick another --k"
            )
        steps, minutes, tpc = zip(*points, strict=True)
        label = f"{run.name} (K′={k})"
        (line,) = by_step.plot(steps, tpc, marker="o", label=label)
        if all(m is not None for m in minutes):  # older runs logged no eval_minutes: on the step axis only
            by_min.plot(minutes, tpc, marker="o", label=label, color=line.get_color())
        best = max(points, key=lambda t: t[2])
        lines.append(
            f"| {run.name} | {k} | {len(points)} | {tpc[-1]:.3f} ({steps[-1]}) | {best[2]:.3f} ({best[0]}) |"
        )
    by_step.set_xlabel("optimizer steps")
    by_min.set_xlabel("wall minutes of the launch")
    by_step.set_ylabel("simulated prove-lossless tokens / cycle")
    for ax in (by_step, by_min):
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    table = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(table)
    print(table + f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``prove-bench``: several methods over one prompt set, in one process, AR first as the reference (DESIGN §3.1).

    prove-bench model=runs/tiny/mars verifier=runs/tiny/verifier draft=runs/tiny/verifier \\
        prompts=data/tiny/test.jsonl methods=[ar,mars,prove,prove-lossless,sd] theta=[0.05,0.1,0.3]

Per row (a method at one point of the parameter sweep) it reports tokens per cycle (which counts the
correction / bonus token), model / verifier / draft forward passes per token, the wall-clock speedup over
AR measured in the same run, agreement with AR's output (the first position where they diverge, per
prompt; lossless methods must agree on every prompt) and task accuracy where the prompts carry an
``answer``. Rows from transformers itself (``generate`` greedy; assisted generation with the same draft,
k = 5, constant schedule) run beside them, so our AR and SD are compared with the library users have.

Timing. Every row decodes a warm-up prompt first (untimed). Then the loop runs prompt by prompt and, for
each prompt, every row in turn (AR first): a slow period of the machine hits all rows alike, so speedups
are ratios measured side by side; ``repeats`` > 1 keeps each row's fastest decode of each prompt. On CUDA,
timings are bracketed by ``torch.cuda.synchronize``.

The functions above ``run_bench`` are pure (lists in, numbers out) and unit-tested on hand-made data;
``run_bench`` is the plumbing. This module imports neither torch nor transformers at import time.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    from prove.decode.decoder import Decoder

SCHEMA = "prove-bench/1"
REFERENCE = "ar"
SWEEP_KEYS = ("theta", "tau", "block_size", "k", "fuse", "fuse_groups")
"""Parameters that take a list (one row per value) from the command line: ``theta=[0.05,0.1]``."""
SYMBOLS = {
    "theta": "θ",
    "tau": "τ",
    "block_size": "K",
    "k": "k",
    "budget": "B",
    "gate": "g",
    "max_mismatches": "m",
    "fuse_groups": "J",
}
ONLY_WITH = {"fuse_groups": "fuse"}
"""Parameters read only when another is true: a row with ``fuse=false`` drops ``fuse_groups`` (one unfused
row, not one per J)."""
LOSSLESS_GREEDY = frozenset({"ar", "prove-lossless", "sd", "hf-greedy", "hf-assisted"})
"""Methods whose greedy output is, by construction, exactly AR's (DESIGN §3 "Guarantees"; ASD with B=0
too, which the bench does not assume)."""
HF_ROWS = ("hf-greedy", "hf-assisted")
DEFAULT_METHODS = ("ar", "mars", "prove", "prove-lossless")
HF_COMPARE_METHODS = ("ar", "sd")
HF_PAIRS = (("ar", "hf-greedy"), ("sd", "hf-assisted"))
"""(our row, transformers' row) whose paired time ratio ``hf_compare`` reports."""


# --------------------------------------------------------------------------------------------------
# pure parts
# --------------------------------------------------------------------------------------------------


def first_divergence(output: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where ``output`` and ``reference`` differ; ``None`` if they are identical.

    If one is a strict prefix of the other (one stopped earlier) they diverge at the shorter length.
    """
    for i, (a, b) in enumerate(zip(output, reference, strict=False)):
        if a != b:
            return i
    if len(output) != len(reference):
        return min(len(output), len(reference))
    return None


def roc_curve(scores: Sequence[float], labels: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC of ``scores`` as a predictor of ``labels`` (True = positive): ``(fpr, tpr, thresholds)``.

    One point per distinct score, from the highest threshold down ("predict positive iff score ≥ t"),
    starting at (0, 0) with threshold +inf and ending at (1, 1). Needs at least one positive and one
    negative label.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must be 1-D and of the same length")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"an ROC curve needs both classes; got {n_pos} positives and {n_neg} negatives")
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last_of_group = np.r_[
        np.nonzero(np.diff(s))[0], s.size - 1
    ]  # index of the last element of each tie group
    tps = np.cumsum(y)[last_of_group]
    fps = np.cumsum(~y)[last_of_group]
    tpr = np.r_[0.0, tps / n_pos]
    fpr = np.r_[0.0, fps / n_neg]
    thresholds = np.r_[np.inf, s[last_of_group]]
    return fpr, tpr, thresholds


def auc(fpr: ArrayLike, tpr: ArrayLike) -> float:
    """Area under a curve by the trapezoid rule (for an ROC curve: P(score⁺ > score⁻) + ½ P(tie))."""
    x, y = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def rate_by_depth(hits: Iterable[Sequence[int]], totals: Iterable[Sequence[int]]) -> list[float]:
    """Σ hits[i] / Σ totals[i] per block position i over requests of ragged length (NaN where 0 proposed)."""
    h: list[float] = []
    t: list[float] = []
    for hit, tot in zip(hits, totals, strict=True):
        if len(hit) != len(tot):
            raise ValueError(f"per-depth counts of different lengths: {len(hit)} vs {len(tot)}")
        grow = len(tot) - len(t)
        if grow > 0:
            h += [0.0] * grow
            t += [0.0] * grow
        for i, (a, b) in enumerate(zip(hit, tot, strict=True)):
            h[i] += a
            t[i] += b
    return [a / b if b else math.nan for a, b in zip(h, t, strict=True)]


def tokens_per_cycle_by_position(
    committed_per_cycle: Iterable[Sequence[int]], bin_size: int
) -> tuple[list[int], list[float], list[int]]:
    """Mean tokens committed per cycle along the response: cycles are binned by the response position
    where they start (``bin_size`` tokens a bin). Returns ``(bin starts, means, cycles per bin)``."""
    if bin_size < 1:
        raise ValueError(f"bin_size={bin_size} must be ≥ 1")
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for request in committed_per_cycle:
        pos = 0
        for n in request:
            b = pos // bin_size
            sums[b] = sums.get(b, 0.0) + n
            counts[b] = counts.get(b, 0) + 1
            pos += n
    bins = sorted(counts)
    return [b * bin_size for b in bins], [sums[b] / counts[b] for b in bins], [counts[b] for b in bins]


def _per_token(n: int, tokens: int) -> float:
    return n / tokens if tokens else math.nan


@dataclass(frozen=True)
class PromptRun:
    """One row's result on one prompt (the per-prompt record of bench.json)."""

    id: Any
    token_ids: list[int]
    text: str
    wall_s: float
    cycles: int
    model_passes: int
    verifier_passes: int = 0
    draft_passes: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)
    proposed_by_depth: list[int] = field(default_factory=list)
    committed_per_cycle: list[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


def summarize(
    runs: Sequence[PromptRun],
    reference: Sequence[PromptRun],
    answers: Sequence[str | None] | None = None,
    *,
    scorer: Callable[[str, str], bool] | None = None,
    bin_size: int = 8,
) -> dict[str, Any]:
    """The numbers of one row, from its per-prompt runs and AR's on the same prompts (same order).

    - ``tokens_per_cycle`` = Σ new tokens / Σ cycles: the mean committed length, correction / bonus
      token included (AR: 1.0).
    - ``*_passes_per_token`` = Σ passes / Σ new tokens.
    - ``speedup_median`` = median over prompts of (tokens/s of the row) / (tokens/s of AR) on that
      prompt; ``speedup_total`` = (Σ tokens / Σ time of the row) / (the same for AR). For a lossless
      method both are plain time ratios (same tokens).
    - ``agreement`` = share of prompts whose output equals AR's token for token; ``first_divergence``
      the position where it first differs (``None`` = identical), per prompt.
    - ``accuracy`` = share of prompts with an answer that ``scorer(text, answer)`` accepts (``None``
      when no prompt has an answer).
    """
    if len(runs) != len(reference):
        raise ValueError(f"{len(runs)} runs but {len(reference)} reference runs: give both the same prompts")
    if not runs:
        raise ValueError("no prompts to summarize")
    tokens = sum(r.new_tokens for r in runs)
    cycles = sum(r.cycles for r in runs)
    wall = sum(r.wall_s for r in runs)
    ref_tokens = sum(r.new_tokens for r in reference)
    ref_wall = sum(r.wall_s for r in reference)
    tps = tokens / wall if wall > 0 else math.nan
    ref_tps = ref_tokens / ref_wall if ref_wall > 0 else math.nan
    ratios = [
        (r.new_tokens / r.wall_s) / (a.new_tokens / a.wall_s)
        for r, a in zip(runs, reference, strict=True)
        if r.wall_s > 0 and a.wall_s > 0 and r.new_tokens and a.new_tokens
    ]
    divergence = [first_divergence(r.token_ids, a.token_ids) for r, a in zip(runs, reference, strict=True)]
    diverged = [d for d in divergence if d is not None]
    correct: list[bool] = []
    if answers is not None:
        if len(answers) != len(runs):
            raise ValueError(f"{len(answers)} answers for {len(runs)} prompts")
        if scorer is None:
            from prove.data.synthetic import score

            scorer = score
        correct = [bool(scorer(r.text, a)) for r, a in zip(runs, answers, strict=True) if a is not None]
    starts, tpc, counts = tokens_per_cycle_by_position((r.committed_per_cycle for r in runs), bin_size)
    return {
        "n_prompts": len(runs),
        "new_tokens": tokens,
        "cycles": cycles,
        "tokens_per_cycle": tokens / cycles if cycles else math.nan,
        "model_passes_per_token": _per_token(sum(r.model_passes for r in runs), tokens),
        "verifier_passes_per_token": _per_token(sum(r.verifier_passes for r in runs), tokens),
        "draft_passes_per_token": _per_token(sum(r.draft_passes for r in runs), tokens),
        "wall_s": wall,
        "tokens_per_s": tps,
        "speedup_median": statistics.median(ratios) if ratios else math.nan,
        "speedup_total": tps / ref_tps if ref_tps and ref_tps > 0 else math.nan,
        "agreement": 1 - len(diverged) / len(runs),
        "first_divergence": divergence,
        "mean_first_divergence": statistics.fmean(diverged) if diverged else None,
        "accuracy": statistics.fmean(correct) if correct else None,
        "acceptance_by_depth": rate_by_depth(
            (r.accepted_by_depth for r in runs), (r.proposed_by_depth for r in runs)
        ),
        "tokens_per_cycle_by_position": {
            "bin_size": bin_size,
            "start": starts,
            "mean": tpc,
            "cycles": counts,
        },
    }


def paired_speedup(ours: Sequence[PromptRun], theirs: Sequence[PromptRun]) -> dict[str, Any]:
    """How much faster ``ours`` ran than ``theirs`` on the same prompts (same order): per prompt their time over
    ours (> 1: ours is faster), its median, the ratio of total times, and whether the tokens are identical
    on every prompt (only then is a time ratio a speed ratio)."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"{len(ours)} and {len(theirs)} runs: give both rows the same, non-empty prompt set")
    ratios = [t.wall_s / o.wall_s for o, t in zip(ours, theirs, strict=True) if o.wall_s > 0 and t.wall_s > 0]
    total_ours, total_theirs = sum(o.wall_s for o in ours), sum(t.wall_s for t in theirs)
    return {
        "median": statistics.median(ratios) if ratios else math.nan,
        "total": total_theirs / total_ours if total_ours > 0 else math.nan,
        "per_prompt": ratios,
        "identical": all(o.token_ids == t.token_ids for o, t in zip(ours, theirs, strict=True)),
    }


def trace_points(traces: Iterable[Sequence[Mapping[str, Any]] | None]) -> dict[str, list[Any]]:
    """Flatten per-cycle trace rows (``Stats.trace``) into per-position columns: ``depth``, ``conf`` (p̃),
    ``q`` (verifier probability, ``None`` when no verifier scored), ``matched`` (the token equals the
    target's greedy token given the same prefix). Positions without a ``matched`` flag are skipped."""
    cols: dict[str, list[Any]] = {"depth": [], "conf": [], "q": [], "matched": []}
    for trace in traces:
        for row in trace or ():
            matched = row.get("matched")
            if matched is None:
                continue
            q = row.get("verifier_prob") or [None] * len(matched)
            for i, (c, v, m) in enumerate(zip(row["conf"], q, matched, strict=True)):
                cols["depth"].append(i)
                cols["conf"].append(float(c))
                cols["q"].append(None if v is None else float(v))
                cols["matched"].append(bool(m))
    return cols


def roc_table(points: Mapping[str, Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """ROC curve and AUC of p̃, q and p̃·q for predicting "matches greedy" (each one needs both classes;
    q and p̃·q need verifier probabilities)."""
    labels = list(points["matched"])
    conf = list(points["conf"])
    scores: dict[str, list[float]] = {"p_tilde": conf}
    if labels and all(v is not None for v in points["q"]):
        scores["q"] = list(points["q"])
        scores["p_tilde_q"] = [c * v for c, v in zip(conf, points["q"], strict=True)]
    out: dict[str, dict[str, Any]] = {}
    if len(set(labels)) < 2:
        return out
    for name, s in scores.items():
        fpr, tpr, thr = roc_curve(s, labels)
        out[name] = {
            "auc": auc(fpr, tpr),
            "fpr": fpr.tolist(),
            "tpr": tpr.tolist(),
            "thresholds": thr.tolist(),
        }
    return out


# --------------------------------------------------------------------------------------------------
# rows and the table
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowSpec:
    """One row of the bench: a method at one point of the sweep."""

    name: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    """``DecodeParams`` given to the Decoder (only those the method reads)."""


def as_values(value: Any) -> list[Any]:
    """A sweep value as a list: ``None`` → ``[None]`` (the method's default), a scalar → ``[x]``."""
    if value is None:
        return [None]
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("an empty sweep list: give at least one value, or null for the method's default")
        return list(value)
    return [value]


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def param_label(key: str, value: Any) -> str:
    if key == "fuse":
        return "fused" if value else "unfused"
    return f"{SYMBOLS.get(key, key)}={_fmt(value)}"


def expand_rows(
    methods: Sequence[str],
    sweeps: Mapping[str, Any],
    uses: Mapping[str, Sequence[str]],
    method_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[RowSpec]:
    """One row per method × point of the sweeps it reads (``uses[method]``); AR first, once.

    ``sweeps`` maps a ``DecodeParams`` name to ``None``, a value, or a list of values, for every method
    that reads it; ``method_params[method]`` overrides or adds values for that method alone (θ is ProVe's
    threshold and NSD's nucleus mass: sweep one of them with ``method_params={prove: {theta: [...]}}``).
    A row's name is the method plus the swept values it was given (``prove θ=0.1``).
    """
    ordered = [REFERENCE] + [m for m in dict.fromkeys(methods) if m != REFERENCE]
    method_params = method_params or {}
    for m, given in method_params.items():
        if m not in ordered:
            raise ValueError(f"method_params names method {m!r}, which is not in methods={list(methods)}")
        unread = set(given) - set(uses.get(m, ()))
        if unread:
            raise ValueError(f"method {m} does not read {sorted(unread)}; it reads {list(uses.get(m, ()))}")
    rows: list[RowSpec] = []
    for m in ordered:
        merged = {**sweeps, **method_params.get(m, {})}
        keys = [k for k in merged if k in uses.get(m, ())]
        grids = [as_values(merged[k]) for k in keys]
        swept = [k for k, g in zip(keys, grids, strict=True) if len(g) > 1]
        for point in itertools.product(*grids):
            params = {k: v for k, v in zip(keys, point, strict=True) if v is not None}
            dropped = [k for k, parent in ONLY_WITH.items() if k in params and not params.get(parent)]
            for k in dropped:
                del params[k]
            label = " ".join(param_label(k, params[k]) for k in swept if k in params)
            row = RowSpec(f"{m} {label}".strip(), m, params)
            if dropped and row in rows:  # e.g. fuse=false once, whatever fuse_groups sweeps
                continue
            rows.append(row)
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"the sweep repeats a row ({names}): give each value once")
    return rows


def is_lossless(method: str, params: Mapping[str, Any]) -> bool:
    """Whether a greedy row must reproduce AR token for token: AR, ProVe-lossless, greedy SD, transformers'
    rows, and ASD with a zero budget, gate or mismatch count (DESIGN §3 "Guarantees")."""
    if method in LOSSLESS_GREEDY:
        return True
    return method == "asd" and any(params.get(k) == 0 for k in ("budget", "gate", "max_mismatches"))


def _num(v: Any, spec: str = ".2f", dash: str = "–") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return dash
    return format(v, spec)


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The Markdown table of bench.json's rows, with its footnotes."""
    head = [
        "method", "params", "tok/cycle¹", "model/tok", "verifier/tok", "draft/tok", "tok/s",
        "speedup (median)", "speedup (total)", "= AR²", "first div. (mean)", "accuracy",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    flagged = False
    for r in rows:
        agree = f"{100 * r['agreement']:.0f}%"
        if r.get("lossless") and r["agreement"] < 1:
            agree += " ⚠"
            flagged = True
        cells = [
            r["name"],
            " ".join(param_label(k, v) for k, v in (r.get("params") or {}).items()) or "–",
            _num(r["tokens_per_cycle"]),
            _num(r["model_passes_per_token"]),
            _num(r["verifier_passes_per_token"] or None),
            _num(r["draft_passes_per_token"] or None),
            _num(r["tokens_per_s"], ".1f"),
            _num(r["speedup_median"]) + "×",
            _num(r["speedup_total"]) + "×",
            agree,
            _num(r["mean_first_divergence"], ".1f"),
            _num(None if r["accuracy"] is None else 100 * r["accuracy"], ".1f", "n/a")
            + ("%" if r["accuracy"] is not None else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "¹ mean tokens committed per cycle, counting the correction / bonus token (AR = 1). "
        "Passes per token count forward passes of each model. Speedups are tokens/s over AR's in the same run.",
        "² share of prompts whose output equals AR's token for token; first div. = mean position of the first "
        "differing token where they differ.",
    ]
    if flagged:
        lines.append("⚠ a lossless method disagreed with AR (expected only from low-precision numerics).")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """``prove-bench``: every method over one prompt set, AR first; writes bench.json, bench.md and plots.

    Launch: ``prove-bench model=PATH verifier=PATH draft=PATH prompts=FILE methods=[ar,mars,prove]
    theta=[0.05,0.1,0.3]``.
    """

    model: str | None = None
    """The model being accelerated: the block proposer (mars / prove / prove-lossless) and the SD target
    (required unless ``hf_compare`` builds one)."""
    verifier: str | None = None
    """ProVe's small scorer (method prove); also the probe whose q the ROC plot uses."""
    draft: str | None = None
    """The SD family's small AR proposer (sd / nsd / asd, and transformers' assisted generation)."""
    prompts: str | None = None
    """JSONL (``prompt`` or ``messages`` per line, optional ``answer``) or plain text, one prompt a line
    (required unless ``hf_compare`` draws random ones)."""
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    """Methods to run (``prove.decode.methods``); ``ar`` is always run first, as the reference."""
    theta: Any = None
    """ProVe's θ (NSD's nucleus mass): a value, or a list to sweep, e.g. ``theta=[0.05,0.1,0.3]``."""
    tau: Any = None
    """MARS's τ: a value or a list to sweep."""
    block_size: Any = None
    """K: a value or a list to sweep (null = the trained block size)."""
    k: Any = None
    """The draft lookahead of the SD family: a value or a list to sweep."""
    fuse: Any = None
    """Fused verify-and-draft for the methods that can (prove-lossless; nsd / asd on the block proposer):
    a value or a list, e.g. ``fuse=[false,true]`` for unfused and fused rows side by side."""
    fuse_groups: Any = None
    """J of the fused rows: ``all`` or m, or a list, e.g. ``fuse_groups=[all,2,3]`` (unfused rows ignore it)."""
    method_params: Any = None
    """Per-method values or sweeps of any ``DecodeParams`` the method reads, overriding the shared ones:
    ``method_params={prove:{theta:[0.05,0.1,0.3]},asd:{budget:[0,8]}}``."""
    n_prompts: int | None = None
    """Use the first N prompts (null = all)."""
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    chat: bool = False
    """``prompt`` fields and plain lines are raw text; ``messages`` use the chat template. ``chat=true`` wraps raw
    text as one user turn of the chat template."""
    warmup: int = 1
    """Prompts each row decodes untimed before the timed loop."""
    repeats: int = 1
    """Timed decodes of each prompt by each row, round-robin over the rows; the fastest counts (a shared
    machine's stalls only slow a decode down, so the minimum is the least noisy estimate)."""
    hf: bool = True
    """Add transformers' rows: ``hf-greedy`` (``generate``), and ``hf-assisted`` when a draft is given."""
    hf_assistant_tokens: int = 5
    """k of transformers' assisted generation (constant schedule, no confidence cut-off)."""
    trace: bool = True
    """An extra, untimed pass of prove-lossless with the verifier as a probe: per-position p̃, q and
    "matches greedy" for the ROC plot and the per-position match curve (block models only)."""
    bin_size: int = 8
    """Response positions per bin of the tokens-per-cycle-along-the-response curve."""
    output_dir: str = "outputs/bench"
    """Where bench.json, bench.md and the PNG plots go."""
    plots: bool = True
    pass_cost_widths: int = 0
    """Measure the model's pass cost t(w)/t(1) for widths w = 1..N (tokens fed in one pass over a cached
    context, through the fused pass's masked path) and print it in bench.md; 0 = skip. It is what decides
    how many groups a fused pass should carry on a given machine."""
    pass_cost_context: int = 128
    """Cached context length of the pass-cost measurement."""
    pass_cost_repeats: int = 10
    """Timed passes per width (round-robin over the widths; the fastest counts)."""
    device: str = "cpu"
    dtype: str = "float32"
    progress: bool = True
    hf_compare: str | None = None
    """Our ``ar`` / ``sd`` against transformers' ``generate`` greedy and assisted generation on random-weight
    models of a real model's shape, built in-process (``prove.decode.random_models.SHAPES``: ``qwen2.5-0.5b``,
    ``tiny``): the target, a ``draft_layers``-layer cut of it as the draft, ``n_prompts`` prompts of
    ``prompt_len`` random token ids, no EOS (every request decodes ``max_new_tokens``). No ``model``,
    ``draft`` or ``prompts``; ``methods`` defaults to ``[ar, sd]``. Tokens must be identical between all four
    rows (a mismatch is an error); bench.json's ``hf_compare`` has the paired time ratios."""
    draft_layers: int = 6
    """``hf_compare``: decoder layers of the layer-skip draft."""
    prompt_len: int = 128
    """``hf_compare``: tokens per random prompt."""
    deep_scale: float = 1.0
    """``hf_compare``: scale of the output projections of the layers the draft skips (< 1: the draft agrees
    with the target more often, like a trained layer-skip draft; ``random_models.random_target_and_draft``)."""

    def __post_init__(self) -> None:
        if self.hf_compare is not None:
            from prove.decode.random_models import SHAPES

            if self.hf_compare not in SHAPES:
                raise ValueError(f"hf_compare={self.hf_compare!r} is not a known shape; pick one of: {', '.join(SHAPES)}")
            if self.model is not None or self.draft is not None or self.prompts is not None:
                raise ValueError("hf_compare builds its own models and prompts: drop model=, draft= and prompts=")
            if list(self.methods) == list(DEFAULT_METHODS):
                self.methods = list(HF_COMPARE_METHODS)
            extra = set(self.methods) - set(HF_COMPARE_METHODS)
            if extra:
                raise ValueError(f"hf_compare runs methods {list(HF_COMPARE_METHODS)} only (no mask token, no verifier); drop {sorted(extra)}")
            if self.prompt_len < 1:
                raise ValueError(f"prompt_len={self.prompt_len} must be ≥ 1")
        else:
            if self.model is None:
                raise ValueError("pass model=PATH (the model being accelerated), or hf_compare=SHAPE")
            if self.prompts is None:
                raise ValueError("pass prompts=FILE (JSONL or plain text), or hf_compare=SHAPE")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be ≥ 1")
        if self.n_prompts is not None and self.n_prompts < 1:
            raise ValueError(f"n_prompts={self.n_prompts} must be ≥ 1 (or null for all)")
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats} must be ≥ 1")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be ≥ 0")
        if self.pass_cost_widths < 0 or self.pass_cost_context < 1 or self.pass_cost_repeats < 1:
            raise ValueError(
                f"pass_cost_widths={self.pass_cost_widths} must be ≥ 0 (0 = off), pass_cost_context="
                f"{self.pass_cost_context} and pass_cost_repeats={self.pass_cost_repeats} ≥ 1"
            )
        if not self.methods:
            raise ValueError("methods is empty: give e.g. methods=[ar,prove-lossless]")
        for key in SWEEP_KEYS:
            as_values(getattr(self, key))
        mp = self.method_params or {}
        if not isinstance(mp, Mapping) or not all(isinstance(v, Mapping) for v in mp.values()):
            raise ValueError(
                f"method_params={mp!r} must map a method to its params, e.g. method_params={{prove:{{theta:[0.05,0.1]}}}}"
            )

    def sweeps(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SWEEP_KEYS}


def register_configs() -> None:
    """Register the schema that ``conf/bench.yaml`` extends (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


def environment(device: Any, dtype: str) -> dict[str, Any]:
    """Versions, hardware and the git commit, for bench.json."""
    import os
    import platform
    import subprocess
    from datetime import datetime, timezone

    import torch
    import transformers

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args],
                cwd=Path(__file__).parent,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    status = git("status", "--porcelain", "--untracked-files=no")
    dev = torch.device(device)
    return {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name(),
        "dtype": dtype,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _PassCounter:
    """Counts forward calls of a module while active (transformers' rows: passes are not in its output)."""

    def __init__(self, module: Any) -> None:
        self.module, self.n, self._handle = module, 0, None

    def __enter__(self) -> _PassCounter:
        self.n = 0

        def hook(*_: Any) -> None:
            self.n += 1

        self._handle = self.module.register_forward_hook(hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._handle is not None
        self._handle.remove()


class _HFRow:
    """transformers' ``generate``: greedy, or assisted generation with ``draft`` (k tokens, constant
    schedule, no confidence cut-off). Same prompt ids, EOS and stop strings as our rows."""

    def __init__(self, model: Any, tokenizer: Any, draft: Any = None, k: int = 5) -> None:
        self.model, self.tokenizer, self.draft, self.k = model, tokenizer, draft, k

    def generate(self, ids: list[int], max_new_tokens: int, eos: list[int], stop: list[str]) -> PromptRun:
        import torch

        device = next(self.model.parameters()).device
        x = torch.tensor([ids], device=device)
        kw: dict[str, Any] = {
            "attention_mask": torch.ones_like(x),
            "max_new_tokens": max_new_tokens,
            "do_sample": False,
            "eos_token_id": eos or None,
            "pad_token_id": (eos or [0])[0]
            if getattr(self.tokenizer, "pad_token_id", None) is None
            else self.tokenizer.pad_token_id,
        }
        if stop:
            kw.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        from prove.decode.checkpoint import MASK_TOKEN

        mask = None if self.tokenizer is None else self.tokenizer.get_vocab().get(MASK_TOKEN)
        if mask is not None:  # our Decoder never outputs <|mask|>; transformers' rows suppress it alike
            kw["suppress_tokens"] = [mask]
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # assisted generation warns about its own internal generation_config
        draft_passes = 0
        gc = None if self.draft is None else self.draft.generation_config
        saved = (
            None
            if gc is None
            else (
                gc.num_assistant_tokens,
                gc.num_assistant_tokens_schedule,
                gc.assistant_confidence_threshold,
            )
        )
        try:
            with _PassCounter(self.model) as target:
                if gc is None:
                    out = self.model.generate(x, **kw)
                else:
                    # transformers reads the assistant's settings from the assistant's generation_config.
                    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = self.k, "constant"
                    gc.assistant_confidence_threshold = 0.0
                    with _PassCounter(self.draft) as d:
                        out = self.model.generate(x, assistant_model=self.draft, **kw)
                    draft_passes = d.n
        finally:
            hf_logging.set_verbosity(verbosity)
            if gc is not None and saved is not None:
                (
                    gc.num_assistant_tokens,
                    gc.num_assistant_tokens_schedule,
                    gc.assistant_confidence_threshold,
                ) = saved
        new = out[0, len(ids) :].tolist()
        # generate pads a finished batch of one with nothing, but strip pad after EOS defensively.
        for i, t in enumerate(new):
            if t in eos:
                new = new[: i + 1]
                break
        return PromptRun(
            id=None,
            token_ids=new,
            text="" if self.tokenizer is None else self.tokenizer.decode(new, skip_special_tokens=True),
            wall_s=0.0,
            cycles=target.n,
            model_passes=target.n,
            draft_passes=draft_passes,
        )


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def load_models(cfg: BenchConfig) -> dict[str, Any]:
    """The tokenizer and every model, loaded once and shared by all rows."""
    from prove.decode.checkpoint import vocab_difference
    from prove.decode.config import DTYPES
    from prove.decode.decoder import check_source, load_model, load_tokenizer

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype={cfg.dtype!r} is not one of {DTYPES}")
    for role in ("model", "verifier", "draft"):
        if getattr(cfg, role) is not None:
            check_source(getattr(cfg, role), role)
    tokenizer = load_tokenizer(cfg.model)

    def load(path: str) -> Any:
        return load_model(path, cfg.device, cfg.dtype)

    models: dict[str, Any] = {"tokenizer": tokenizer, "model": load(cfg.model)}
    loaded: dict[str, Any] = {cfg.model: models["model"]}
    for role in ("verifier", "draft"):
        path = getattr(cfg, role)
        if path is None:
            continue
        if vocab_difference(tokenizer, load_tokenizer(path)):
            raise ValueError(
                f"{role}={path} has a different tokenizer from model={cfg.model}: the {role} must share the "
                "model's vocabulary (apart from <|mask|>)"
            )
        if path not in loaded:
            loaded[path] = load(path)
        models[role] = loaded[path]
    return models


def build_decoders(
    cfg: BenchConfig, rows: Sequence[RowSpec], models: Mapping[str, Any]
) -> dict[str, Decoder]:
    """A Decoder per row over the shared models; every construction error surfaces before any timing."""
    from prove.decode.decoder import Decoder
    from prove.decode.methods import get_method

    decoders: dict[str, Decoder] = {}
    for row in rows:
        method = get_method(row.method)
        decoders[row.name] = Decoder(
            models["model"],
            models["tokenizer"],
            method=method,
            verifier=models.get("verifier") if method.verifier == "small" else None,
            draft=models.get("draft") if method.proposer == "draft" else None,
            device=cfg.device,
            **row.params,
        )
    return decoders


def _resolved_params(decoder: Decoder) -> dict[str, Any]:
    params = {k: getattr(decoder.params, k) for k in decoder.method.uses}
    if not params.get("fuse"):  # unfused: the fuse knobs say nothing
        params = {k: v for k, v in params.items() if k not in ("fuse", "fuse_groups")}
    return params


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the bench; write bench.json, bench.md and the plots into ``cfg.output_dir``; return the report."""
    import sys

    from prove.decode.methods import METHODS, resolve_params
    from prove.decode.prompts import read_prompts, render
    from tqdm import tqdm

    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; registered: {', '.join(sorted(METHODS))}")
    uses = {name: m.uses for name, m in METHODS.items()}
    specs = expand_rows(cfg.methods, cfg.sweeps(), uses, cfg.method_params)
    for spec in specs:  # every row's parameters are checked before any model loads
        resolve_params(spec.method, **spec.params)
    if cfg.hf_compare is not None:
        models, prompt_ids = hf_compare_setup(cfg)
        records: list[Any] = [None] * len(prompt_ids)
        keys: list[Any] = list(range(len(prompt_ids)))
    else:
        assert cfg.prompts is not None, "BenchConfig checks prompts="
        records = read_prompts(cfg.prompts)[: cfg.n_prompts]
        keys = [r.id for r in records]
        models = load_models(cfg)
    answers = [None if r is None else r.answer for r in records]
    has_answers = any(a is not None for a in answers)
    tokenizer = models["tokenizer"]
    decoders = build_decoders(cfg, specs, models)
    ref = decoders[REFERENCE]
    hf_rows: dict[str, _HFRow] = {}
    if cfg.hf:
        hf_rows["hf-greedy"] = _HFRow(models["model"], tokenizer)
        if "draft" in models:
            hf_rows["hf-assisted"] = _HFRow(
                models["model"], tokenizer, models["draft"], cfg.hf_assistant_tokens
            )
    names = [REFERENCE, *hf_rows, *(s.name for s in specs[1:])]
    prompts = prompt_ids if cfg.hf_compare is not None else [ref.encode(render(r, cfg.chat)) for r in records]
    for key, ids in zip(keys, prompts, strict=True):  # too long for a model: fail before any timing
        for dec in decoders.values():
            try:
                dec.check_length(len(ids), cfg.max_new_tokens)
            except ValueError as e:
                raise ValueError(f"prompt {key!r}: {e}") from None
    eos = ref.eos_ids()
    stop = list(cfg.stop)

    def run_one(name: str, ids: list[int], rid: Any) -> PromptRun:
        _sync(cfg.device)
        if name in hf_rows:
            t0 = _now()
            run = hf_rows[name].generate(ids, cfg.max_new_tokens, eos, stop)
            _sync(cfg.device)
            return dataclasses.replace(run, id=rid, wall_s=_now() - t0)
        t0 = _now()
        out = decoders[name].generate(ids, max_new_tokens=cfg.max_new_tokens, stop=stop or None)
        _sync(cfg.device)
        wall = _now() - t0
        s = out.stats
        return PromptRun(
            id=rid,
            token_ids=list(out.token_ids),
            text=out.text,
            wall_s=wall,
            cycles=s.cycles,
            model_passes=s.model_passes,
            verifier_passes=s.verifier_passes,
            draft_passes=s.draft_passes,
            accepted_by_depth=list(s.accepted_by_depth),
            proposed_by_depth=list(s.proposed_by_depth),
            committed_per_cycle=list(s.committed_per_cycle),
        )

    # 1) warm-up: every row decodes the first prompts, untimed
    for ids in prompts[: cfg.warmup]:
        for name in names:
            run_one(name, ids, None)
    # 2) timed loop: prompt by prompt, every row in turn (AR first)
    runs: dict[str, list[PromptRun]] = {name: [] for name in names}
    for key, ids in tqdm(
        list(zip(keys, prompts, strict=True)),
        desc="bench",
        unit="prompt",
        file=sys.stderr,
        disable=not cfg.progress,
    ):
        tries: dict[str, list[PromptRun]] = {name: [] for name in names}
        for _ in range(
            cfg.repeats
        ):  # round-robin, so one stall of the machine does not hit every try of a row
            for name in names:
                tries[name].append(run_one(name, ids, key))
        for name in names:
            runs[name].append(min(tries[name], key=lambda r: r.wall_s))
    # 3) untimed trace pass for the ROC / per-position match curves
    trace = trace_pass(cfg, models, prompts, eos, stop) if cfg.trace and cfg.hf_compare is None else None
    # 4) the pass cost curve t(w)/t(1)
    cost = None
    if cfg.pass_cost_widths:
        cost = pass_cost(
            models["model"], prompts[0], cfg.pass_cost_widths, cfg.pass_cost_context, cfg.pass_cost_repeats, cfg.device
        )

    spec_by_name = {s.name: s for s in specs}
    rows = []
    for name in names:
        summary = summarize(
            runs[name], runs[REFERENCE], answers if has_answers else None, bin_size=cfg.bin_size
        )
        spec = spec_by_name.get(name)
        rows.append(
            {
                "name": name,
                "method": spec.method if spec else name,
                "params": _resolved_params(decoders[name])
                if spec
                else ({"k": cfg.hf_assistant_tokens} if name == "hf-assisted" else {}),
                "swept": dict(spec.params) if spec else {},
                "lossless": is_lossless(spec.method, _resolved_params(decoders[name])) if spec else True,
                **summary,
                "per_prompt": [
                    {
                        "id": r.id,
                        "new_tokens": r.new_tokens,
                        "cycles": r.cycles,
                        "wall_s": r.wall_s,
                        "first_divergence": d,
                        "text": r.text,
                    }
                    for r, d in zip(runs[name], summary["first_divergence"], strict=True)
                ],
            }
        )
    report = {
        "schema": SCHEMA,
        "env": environment(cfg.device, cfg.dtype),
        "config": dataclasses.asdict(cfg),
        "models": {"model": cfg.model, "verifier": cfg.verifier, "draft": cfg.draft}
        if cfg.hf_compare is None
        else {
            "model": f"random {cfg.hf_compare}",
            "verifier": None,
            "draft": f"its first {cfg.draft_layers} layers",
        },
        "prompts": {
            "path": str(cfg.prompts) if cfg.hf_compare is None else f"{len(prompts)} × {cfg.prompt_len} random ids",
            "n": len(records),
            "with_answers": sum(a is not None for a in answers),
        },
        "reference": REFERENCE,
        "rows": rows,
        "lossless_violations": [r["name"] for r in rows if r["lossless"] and r["agreement"] < 1],
        "trace": trace,
        "pass_cost": cost,
        "plots": {},
    }
    if cfg.hf_compare is not None:
        report["hf_compare"] = {
            "shape": cfg.hf_compare,
            "draft_layers": cfg.draft_layers,
            "prompt_len": cfg.prompt_len,
            "deep_scale": cfg.deep_scale,
            **{f"{ours}_vs_{theirs}": paired_speedup(runs[ours], runs[theirs])
               for ours, theirs in HF_PAIRS if ours in runs and theirs in runs},
        }  # fmt: skip
    write_report(report, cfg.output_dir, plots=cfg.plots)
    differ = [k for k, v in (report.get("hf_compare") or {}).items() if isinstance(v, dict) and not v["identical"]]
    if differ:
        raise RuntimeError(f"hf_compare: tokens differ between ours and transformers' ({differ}); see {cfg.output_dir}")
    return report


def hf_compare_setup(cfg: BenchConfig) -> tuple[dict[str, Any], list[list[int]]]:
    """``hf_compare``'s random-weight target and layer-skip draft, and its random prompts."""
    from prove.decode.config import DTYPES
    from prove.decode.random_models import SHAPES, random_prompts, random_target_and_draft

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype={cfg.dtype!r} is not one of {DTYPES}")
    assert cfg.hf_compare is not None
    target, draft = random_target_and_draft(
        cfg.hf_compare, cfg.draft_layers, dtype=cfg.dtype, device=cfg.device, deep_scale=cfg.deep_scale
    )
    vocab = SHAPES[cfg.hf_compare]["vocab_size"]
    prompts = random_prompts(cfg.n_prompts or 3, cfg.prompt_len, vocab)
    return {"tokenizer": None, "model": target, "draft": draft}, prompts


def _now() -> float:
    import time

    return time.perf_counter()


def trace_pass(
    cfg: BenchConfig, models: Mapping[str, Any], prompts: Sequence[list[int]], eos: list[int], stop: list[str]
) -> dict[str, Any] | None:
    """prove-lossless with ``trace=True`` (and the verifier as a probe when given), untimed: per-position
    p̃, q and "matches greedy"; ``None`` when the model is not a block proposer."""
    import warnings

    from prove.decode.decoder import Decoder

    block = as_values(cfg.block_size)[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dec = Decoder(
                models["model"],
                models["tokenizer"],
                method="prove-lossless",
                verifier=models.get("verifier"),
                device=cfg.device,
                trace=True,
                **({"block_size": block} if block is not None else {}),
            )
    except ValueError as e:  # not a block model: no trace
        return {"skipped": str(e)}
    traces = [
        dec.generate(ids, max_new_tokens=cfg.max_new_tokens, stop=stop or None).stats.trace for ids in prompts
    ]
    points = trace_points(traces)
    match = rate_by_depth(
        ([int(m) for m in row["matched"]] for t in traces for row in (t or ())),
        ([1] * len(row["matched"]) for t in traces for row in (t or ())),
    )
    return {
        "method": "prove-lossless",
        "block_size": dec.params.block_size,
        "verifier": cfg.verifier,
        "positions": len(points["matched"]),
        "match_by_depth": match,
        "roc": roc_table(points),
    }


def pass_cost(
    model: Any, prompt: Sequence[int], widths: int, context: int, repeats: int, device: Any
) -> dict[str, Any]:
    """Wall time of one pass feeding w tokens (w = 1..``widths``) after ``context`` cached tokens: the last
    committed token plus a causal chain of w − 1 through ``ModelRunner.forward_tree`` (the fused pass's
    masked path; w = 1 is an AR step). Round-robin over the widths, ``repeats`` times; the fastest counts.
    Also times the plain ``forward`` for w = 1 (AR's unmasked step), to show the mask's own overhead."""
    import torch
    from prove.decode.engine import ModelRunner

    seq = (list(prompt) * (context // max(len(prompt), 1) + 1))[:context]
    runner = ModelRunner(model)
    runner.forward(seq)  # cache the context; every timed pass re-feeds only its last token
    best = [math.inf] * widths
    plain = math.inf
    for _ in range(repeats):
        for w in range(1, widths + 1):
            e = w - 1
            offsets, attend = torch.arange(e), torch.ones(e, e, dtype=torch.bool).tril()
            _sync(device)
            t0 = _now()
            runner.forward_tree(seq, seq[:e], offsets=offsets, attend=attend, chain=e)
            _sync(device)
            best[w - 1] = min(best[w - 1], _now() - t0)
        t0 = _now()
        runner.forward(seq)
        _sync(device)
        plain = min(plain, _now() - t0)
    return {
        "context": context,
        "repeats": repeats,
        "widths": list(range(1, widths + 1)),
        "ms": [1000 * t for t in best],
        "ratio": [t / best[0] for t in best],
        "plain_t1_ms": 1000 * plain,
    }


def render_pass_cost(cost: Mapping[str, Any], per_line: int = 10) -> str:
    """bench.md's section for ``pass_cost``: t(w)/t(1), ``per_line`` widths a table row."""
    widths, ratio = cost["widths"], cost["ratio"]
    head = ["w"] + [f"+{i}" for i in range(per_line)]
    lines = [
        "",
        f"## Pass cost t(w)/t(1): one pass feeding w tokens after {cost['context']} cached ones",
        "",
        f"t(1) = {cost['ms'][0]:.2f} ms through the fused pass's masked path ({cost['plain_t1_ms']:.2f} ms as a "
        f"plain AR step); fastest of {cost['repeats']}. A fused pass with all groups is k + 1 + (k+1)(K−1) wide.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---:"] * len(head)) + "|",
    ]
    for lo in range(0, len(widths), per_line):
        cells = [str(widths[lo])] + [f"{r:.2f}" for r in ratio[lo : lo + per_line]]
        cells += [""] * (len(head) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], output_dir: str | Path, *, plots: bool = True) -> dict[str, Any]:
    """Write bench.json, bench.md (and print it) and, if asked, the plots; returns the report."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        from prove.decode.bench_plots import write_plots

        report["plots"] = {k: str(v) for k, v in write_plots(report, out).items()}
    table = render_table(report["rows"])
    header = _md_header(report)
    cost = report.get("pass_cost")
    (out / "bench.md").write_text(header + table + (render_pass_cost(cost) if cost else ""))
    (out / "bench.json").write_text(json.dumps(_jsonable(report), indent=1, ensure_ascii=False) + "\n")
    return report


def _md_header(report: Mapping[str, Any]) -> str:
    env = report["env"]
    lines = [
        f"# prove-bench — {report['prompts']['n']} prompts, {env['device']} ({env['device_name']}), {env['dtype']}",
        "",
        f"model `{report['models']['model']}`, verifier `{report['models']['verifier']}`, "
        f"draft `{report['models']['draft']}`; torch {env['torch']}, transformers {env['transformers']}, "
        f"commit {(env['git_commit'] or 'n/a')[:10]}{' (dirty)' if env.get('git_dirty') else ''}",
        "",
    ]
    hfc = report.get("hf_compare")
    if hfc:
        pairs = "; ".join(
            f"{k.replace('_vs_', ' vs ')}: {v['median']:.2f}× (median), {v['total']:.2f}× (total), tokens "
            + ("identical" if v["identical"] else "DIFFER ⚠")
            for k, v in hfc.items()
            if isinstance(v, dict)
        )
        lines += [f"hf_compare ({hfc['shape']} shape, {hfc['draft_layers']}-layer draft): {pairs}", ""]
    trace = report.get("trace") or {}
    if trace.get("roc"):
        aucs = ", ".join(
            f"{k.replace('p_tilde_q', 'p̃·q').replace('p_tilde', 'p̃')} {v['auc']:.3f}"
            for k, v in trace["roc"].items()
        )
        lines += [
            f'AUC for predicting "matches greedy" (K={trace["block_size"]}, {trace["positions"]} positions): {aucs}',
            "",
        ]
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    """NaN / inf → None (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x

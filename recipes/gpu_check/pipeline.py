"""Part 5, pipeline: the whole job of a one-GPU user, through the entry points that user runs.

Each stage is a subprocess of the real front door — ``make train-proposer`` / ``make train-verifier`` as the Makefile
launches them on one GPU (``NNODES=1 GPUS_PER_NODE=1``: ``prove-train``, Hydra, ``deepspeed=zero3``), then
``prove-decode`` and ``prove-bench`` — on the generated arithmetic data and the tiny recipe's tokenizer:

1. **install** — a checkout whose venv lacks hydra or DeepSpeed installs from ``wheelhouse/`` beside it
   (``make install WHEELHOUSE=wheelhouse``, no index); one that has them goes on.
2. **sft** — proposer SFT, a few dozen steps (a Qwen2.5-0.5B-shaped body with random weights, bf16,
   FlexAttention on the GPU; ``--tiny``: the demo's smoke shape, fp32 on the CPU with gloo).
3. **mars** — MARS from the SFT checkpoint; killed (SIGKILL to the whole launch) once its first checkpoint is
   written, then relaunched with the same command: the rerun must resume from that checkpoint (its step is
   reported) and finish every step.
4. **verifier** — ``make train-verifier``: the verifier's SFT, then a few steps of distillation on the MARS
   proposer's greedy outputs.
5. **cpu-adam** — ``deepspeed=zero3_offload_optimizer`` (the 32B recipe's): DeepSpeed's CPU Adam is built just in
   time and a step runs, or the build is refused in one line; either is a pass, a traceback is not. ``--tiny`` runs
   the offload path with torch's AdamW (no compiler needed) and only asks whether the op is compatible.
6. **decode** — ``prove-decode`` of the MARS checkpoint (prove-lossless) on the device.
7. **bench** — ``prove-bench`` of ar, prove (the distilled verifier), prove-lossless unfused and fused, beside
   transformers' ``generate``: in fp32 every lossless row must equal ``generate`` token for token; in bf16 (GPU
   only) the speeds.

Each stage reports its wall time and, for training, s/step, tokens/s and peak memory (the GPU's, polled through
``nvidia-smi``; on the CPU the launch's peak RSS). Every stage's result is kept in ``<out>/pipeline/state.json``:
``--from-stage mars`` reruns from there, the earlier stages read back from the file. Only this part needs hydra and
DeepSpeed, in the subprocesses; this module imports neither.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.recipes.gpu_check.config import CheckConfig

from prove.recipes.gpu_check.runtime import check_entry

STAGES = ("install", "sft", "mars", "verifier", "cpu-adam", "decode", "bench")  # config.PIPELINE_STAGES
ROOT = Path(__file__).resolve().parents[2]
"""The checkout (``make gpu-check`` links ``prove`` to it): its Makefile is the front door each stage goes through."""
STAMP = ".venv/.prove-installed"


def train_overrides(cfg: CheckConfig, run: Path) -> list[str]:
    """prove-train overrides shared by every stage: where, which data, which model, how long."""
    p = cfg.pipeline
    common = [f"run_dir={run / 'runs'}", f"data.path={run / 'data' / 'train.jsonl'}", "deepspeed=zero3",
              "logger=none", "trainer.logging_steps=1", "trainer.save_total_limit=2",
              "+trainer.extra.include_num_input_tokens_seen=all",
              f"stages.proposer.sft.max_steps={p['sft_steps']}", f"stages.proposer.mars.max_steps={p['mars_steps']}",
              f"stages.verifier.sft.max_steps={p['verifier_steps']}",
              f"stages.verifier.distill.max_steps={p['distill_steps']}",
              f"trainer.save_steps={p['save_steps']}", f"trainer.per_device_train_batch_size={p['batch']}",
              f"max_len={p['max_len']}", f"block_size={p['block_size']}", f"distill.num_prompts={p['distill_prompts']}",
              f"distill.max_new_tokens={p['new_tokens']}", f"data.synthetic.n={p['rows']}",
              "data.synthetic.test_size=16"]  # fmt: skip
    shape = p["shape"]
    model = [f"stages.proposer.layers={shape['layers']}", f"stages.verifier.layers={p['verifier_layers']}",
             *(f"model.scratch.{k}={v}" for k, v in shape.items() if k != "layers")]  # fmt: skip
    if cfg.tiny:
        return [*common, *model, "model.attn_implementation=eager"]
    return [*common, *model, "trainer.bf16=true", "model.attn_implementation=flex_attention"]


def pipeline_settings(tiny: bool) -> dict[str, Any]:
    """The run's size: tiny = the demo's smoke shape on the CPU, else a Qwen2.5-0.5B body (random weights) on the
    tiny recipe's tokenizer."""
    if tiny:
        return dict(
            shape=dict(layers=2, hidden=32, heads=2, kv_heads=2, intermediate=64, vocab_size=300, tokenizer_rows=256),
            verifier_layers=1, sft_steps=4, mars_steps=8, save_steps=3, verifier_steps=3, distill_steps=3, batch=8,
            max_len=128, block_size=4, distill_prompts=4, new_tokens=16, rows=400, bench_prompts=3,
        )  # fmt: skip
    return dict(
        shape=dict(layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab_size=512,
                   tokenizer_rows=2000),
        verifier_layers=2, sft_steps=30, mars_steps=30, save_steps=10, verifier_steps=10, distill_steps=6, batch=8,
        max_len=256, block_size=8, distill_prompts=16, new_tokens=64, rows=2000, bench_prompts=8,
    )  # fmt: skip


def child_env(cfg: CheckConfig) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline")
    env.setdefault("OMP_NUM_THREADS", "1")
    if cfg.tiny:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a machine with a GPU
    return env


class PeakMemory:
    """The peak GPU memory in use while a stage runs (``nvidia-smi``, every 0.5 s), in GiB; None without a GPU."""

    def __init__(self, device: str) -> None:
        self.on = device.startswith("cuda") and shutil.which("nvidia-smi") is not None
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout  # fmt: skip
                self.peak_mib = max(self.peak_mib, max(float(x) for x in out.split()))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                continue

    def __enter__(self) -> PeakMemory:
        if self.on:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    @property
    def gib(self) -> float | None:
        return self.peak_mib / 1024 if self.on else None


RSS_WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print(f'gpu-check-peak-rss-kib {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', flush=True); "
    "sys.exit(rc)"
)
"""Runs a command and prints the largest resident set any of its processes reached (Linux: KiB)."""


def launch(cmd: list[str], cfg: CheckConfig, log: Path, **kw: Any) -> subprocess.Popen:
    """``cmd`` in its own session (a kill reaches every process of the launch), output to ``log`` as it comes."""
    f = log.open("a")
    f.write(f"\n$ {' '.join(cmd)}\n")
    f.flush()
    return subprocess.Popen([sys.executable, "-c", RSS_WRAPPER, *cmd], cwd=ROOT, env=child_env(cfg), stdout=f,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)  # fmt: skip


def run_logged(cmd: list[str], cfg: CheckConfig, log: Path, timeout: float) -> tuple[int, str]:
    """Run ``cmd`` to its end; (exit status, its part of the log)."""
    start = log.stat().st_size if log.exists() else 0
    proc = launch(cmd, cfg, log)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = 124
    with log.open() as f:
        f.seek(start)
        return rc, f.read()


def make_cmd(
    target: str, cfg: CheckConfig, run: Path, *extra: str, args: list[str] | None = None
) -> list[str]:
    """``make <target>`` as a one-GPU user types it; an installed checkout is not reinstalled."""
    keep = ["-o", STAMP] if (ROOT / STAMP).exists() else []
    overrides = " ".join(args if args is not None else train_overrides(cfg, run))
    return ["make", "--no-print-directory", *keep, target, "RECIPE=tiny", "NNODES=1", "GPUS_PER_NODE=1",
            *extra, f"ARGS={overrides}"]  # fmt: skip


LOG_DICT = re.compile(r"\{'.*\}")


def run_numbers(steps: list[dict[str, Any]], final: dict[str, Any]) -> dict[str, Any]:
    """One Trainer run's numbers from its step logs (each carries the cumulative ``train_runtime`` and
    ``num_input_tokens_seen``): s/step and tokens/s after the first step (which compiles and warms up), the first
    step's seconds, the first and last loss."""
    res: dict[str, Any] = {"steps_logged": len(steps)}
    if not steps:
        return res
    res["loss_first"], res["loss_last"] = float(steps[0]["loss"]), float(steps[-1]["loss"])
    rt = [float(s["train_runtime"]) for s in steps if "train_runtime" in s]
    seen = [float(s["num_input_tokens_seen"]) for s in steps if "num_input_tokens_seen" in s]
    if len(rt) == len(steps) >= 2 and rt[-1] > rt[0]:
        res["first_step_s"] = rt[0]
        res["s_per_step"] = (rt[-1] - rt[0]) / (len(rt) - 1)
        if len(seen) == len(rt):
            res["tokens_per_s"] = (seen[-1] - seen[0]) / (rt[-1] - rt[0])
    elif final:  # older transformers: the run's mean, first step included
        res["s_per_step"] = float(final["train_runtime"]) / len(steps)
        if len(seen) >= 2:
            res["tokens_per_s"] = (seen[-1] - seen[0]) / (len(seen) - 1) / res["s_per_step"]
    return res


def training_numbers(out: str) -> dict[str, Any]:
    """From a launch's output: the numbers of its last Trainer run (``make train-verifier`` runs two: the verifier's
    SFT, then distill; each one's are in ``runs``) and the launch's peak RSS."""
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for line in out.splitlines():
        m = LOG_DICT.search(line)  # after a progress bar's carriage returns, on the same line
        if not m:
            continue
        try:
            d = ast.literal_eval(m.group(0))
        except (ValueError, SyntaxError):
            continue
        if "train_steps_per_second" in d:  # the run's closing metrics
            runs.append(run_numbers(steps, d))
            steps = []
        elif "loss" in d:
            steps.append(d)
    if steps:  # a run cut short
        runs.append(run_numbers(steps, {}))
    res: dict[str, Any] = dict(runs[-1]) if runs else {"steps_logged": 0}
    if len(runs) > 1:
        res["runs"] = runs
    rss = re.findall(r"gpu-check-peak-rss-kib (\d+)", out)
    if rss:
        res["peak_rss_gib"] = int(rss[-1]) / 2**20
    return res


def stage_install(cfg: CheckConfig, run: Path, log: Path) -> tuple[bool, dict[str, Any]]:
    """hydra and DeepSpeed importable by the checkout's venv; else ``make install``, from ``wheelhouse/`` beside the
    checkout when one is there (no index), and the probe again."""
    probe = [str(ROOT / ".venv" / "bin" / "python"), "-c", "import hydra, omegaconf, deepspeed, datasets"]
    if (ROOT / STAMP).exists() and run_logged(probe, cfg, log, 300)[0] == 0:
        return True, {"note": "installed: hydra, omegaconf, deepspeed, datasets import"}
    wheelhouse = ROOT / "wheelhouse"
    extra = [f"WHEELHOUSE={wheelhouse}"] if (wheelhouse / "wheelhouse.json").exists() else []
    t0 = time.perf_counter()
    rc, out = run_logged(["make", "--no-print-directory", "install", *extra], cfg, log, cfg.pipeline_timeout)
    res: dict[str, Any] = {"wheelhouse": str(wheelhouse) if extra else None, "rc": rc,
                           "wall_s": time.perf_counter() - t0}  # fmt: skip
    if rc:
        res["error"] = last_line(out)
        return False, res
    rc, out = run_logged(probe, cfg, log, 300)
    if rc:
        res["error"] = last_line(out)
    return rc == 0, res


NOISE = (
    "gpu-check-peak-rss",
    "make: ***",
    "Set the environment variable HYDRA_FULL_ERROR",
    "make[",
    "prove-",
)


def last_line(out: str) -> str:
    """The launch's last line that says something (not make's or Hydra's closing lines): its error, usually; a CLI's
    own one-line error (``prove-train: error: …``) first."""
    own = [x.strip() for x in out.splitlines() if re.match(r"prove-[a-z]+: error: ", x.strip())]
    if own:
        return own[-1][:400]
    lines = [x.strip() for x in out.splitlines() if x.strip() and not x.strip().startswith(NOISE)]
    return lines[-1][:400] if lines else ""


def stage_train(target: str, stages: str | None, cfg: CheckConfig, run: Path, log: Path) -> tuple[bool, dict]:
    extra = [f"STAGES={stages}"] if stages else []
    with PeakMemory(cfg.device) as mem:
        t0 = time.perf_counter()
        rc, out = run_logged(make_cmd(target, cfg, run, *extra), cfg, log, cfg.pipeline_timeout)
    res = {"rc": rc, "wall_s": time.perf_counter() - t0, "peak_gib": mem.gib, **training_numbers(out)}
    if rc:
        res["error"] = last_line(out)
    return rc == 0, res


def stage_mars(cfg: CheckConfig, run: Path, log: Path) -> tuple[bool, dict[str, Any]]:
    """MARS killed once its first checkpoint is written, then the same command again: it must resume there."""
    mars = run / "runs" / "mars"
    cmd = make_cmd("train-proposer", cfg, run, "STAGES=mars")
    t0 = time.perf_counter()
    proc = launch(cmd, cfg, log)
    deadline = time.monotonic() + cfg.pipeline_timeout
    while not list(mars.glob("checkpoint-*/trainer_state.json")):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            return False, {"error": "MARS ended or stalled before its first checkpoint: see pipeline.log"}
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the node dies mid-stage
    proc.wait()
    killed_at = sorted(int(p.parent.name.split("-")[1]) for p in mars.glob("checkpoint-*/trainer_state.json"))
    first = {"wall_s": time.perf_counter() - t0, "killed_after_checkpoints": killed_at}
    ok, res = stage_train("train-proposer", "mars", cfg, run, log)
    with log.open() as f:
        text = f.read()
    m = re.findall(r"resuming from \S*checkpoint-(\d+)", text)
    res["resumed_from_step"] = int(m[-1]) if m else None
    meta = mars / "prove.json"
    res["final_step"] = json.loads(meta.read_text()).get("global_step") if meta.exists() else None
    res["first_launch"] = first
    resumed = res["resumed_from_step"] is not None and res["resumed_from_step"] in killed_at
    return ok and resumed and res["final_step"] == cfg.pipeline["mars_steps"], res


def stage_cpu_adam(cfg: CheckConfig, run: Path, log: Path) -> tuple[bool, dict[str, Any]]:
    """zero3_offload_optimizer through prove-train for two steps: CPU Adam built (or refused in one line)."""
    probe = ("from deepspeed.ops.op_builder import CPUAdamBuilder as B; b = B(); ok = b.is_compatible(verbose=False); "
             "print('cpu-adam-compatible', ok)")  # fmt: skip
    venv_py = ROOT / ".venv" / "bin" / "python"
    rc, out = run_logged([str(venv_py), "-c", probe], cfg, log, 300)
    compatible = "cpu-adam-compatible True" in out
    out_dir = run / "runs" / "cpu-adam"
    args = [*train_overrides(cfg, run), "stage=sft", "deepspeed=zero3_offload_optimizer", f"output_dir={out_dir}",
            "max_steps=2", "stage.init_from=null"]  # fmt: skip
    if cfg.tiny:
        args.append("deepspeed.optimizer.params.torch_adam=true")  # no JIT build in the CPU smoke run
    cmd = [str(ROOT / ".venv" / "bin" / "prove-train"), "recipe=tiny", *args]
    t0 = time.perf_counter()
    rc, out = run_logged(cmd, cfg, log, cfg.pipeline_timeout)
    res: dict[str, Any] = {"compatible": compatible, "rc": rc, "wall_s": time.perf_counter() - t0,
                           "torch_adam": cfg.tiny, **training_numbers(out)}  # fmt: skip
    if rc == 0:
        return True, res
    # refused: prove-train's own one-line error (no traceback) names what is missing
    res["error"] = last_line(out)
    res["refused_in_one_line"] = "Traceback" not in out and "CPU Adam" in res["error"]
    return res["refused_in_one_line"], res


def stage_decode(cfg: CheckConfig, run: Path, log: Path) -> tuple[bool, dict[str, Any]]:
    p = cfg.pipeline
    prompts, out_file = run / "data" / "test.jsonl", run / "decode.jsonl"
    cmd = [str(ROOT / ".venv" / "bin" / "prove-decode"), f"model={run / 'runs' / 'mars'}", "method=prove-lossless",
           f"prompts={prompts}", f"output={out_file}", f"device={cfg.device}", "dtype=float32",
           f"max_new_tokens={p['new_tokens']}"]  # fmt: skip
    t0 = time.perf_counter()
    rc, out = run_logged(cmd, cfg, log, cfg.pipeline_timeout)
    rows = [json.loads(x) for x in out_file.read_text().splitlines()] if out_file.exists() else []
    res: dict[str, Any] = {"rc": rc, "wall_s": time.perf_counter() - t0, "records": len(rows)}
    if rc:
        res["error"] = last_line(out)
    return rc == 0 and len(rows) > 0, res


def bench_cmd(cfg: CheckConfig, run: Path, dtype: str) -> list[str]:
    p = cfg.pipeline
    return [str(ROOT / ".venv" / "bin" / "prove-bench"), f"model={run / 'runs' / 'mars'}",
            f"verifier={run / 'runs' / 'verifier-distill'}", f"prompts={run / 'data' / 'test.jsonl'}",
            "methods=[ar,prove,prove-lossless]", "method_params={prove-lossless:{fuse:[false,true]}}",
            f"n_prompts={p['bench_prompts']}", f"max_new_tokens={p['new_tokens']}", "hf=true", "plots=false",
            "quality=false", f"device={cfg.device}", f"dtype={dtype}", f"output_dir={run / f'bench-{dtype}'}"]  # fmt: skip


def stage_bench(cfg: CheckConfig, run: Path, log: Path) -> tuple[bool, dict[str, Any]]:
    """fp32: every lossless row (prove-lossless unfused and fused, transformers' generate) equals ar; bf16 (a GPU
    only): the speeds."""
    res: dict[str, Any] = {}
    ok = True
    t0 = time.perf_counter()
    for dtype in ("float32",) if cfg.tiny else ("float32", "bfloat16"):
        rc, out = run_logged(bench_cmd(cfg, run, dtype), cfg, log, cfg.pipeline_timeout)
        path = run / f"bench-{dtype}" / "bench.json"
        if rc or not path.exists():
            res[dtype] = {"rc": rc, "error": last_line(out)}
            ok = False
            continue
        report = json.loads(path.read_text())
        rows = {r["name"]: {k: r.get(k) for k in ("method", "lossless", "agreement", "tokens_per_s",
                                                   "tokens_per_cycle", "speedup_total")}
                for r in report["rows"]}  # fmt: skip
        res[dtype] = {"rows": rows, "lossless_violations": report["lossless_violations"]}
        if dtype == "float32":
            lossless = [n for n, r in rows.items() if r["lossless"]]
            ok = ok and len(lossless) >= 4 and not report["lossless_violations"] and "hf-greedy" in rows
    res["wall_s"] = time.perf_counter() - t0
    return ok, res


def run_pipeline(cfg: CheckConfig, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The stages from ``cfg.pipeline_from`` on; the earlier ones read back from state.json."""
    run = Path(cfg.out) / "pipeline"
    run.mkdir(parents=True, exist_ok=True)
    state_path, log = run / "state.json", run / "pipeline.log"
    start = STAGES.index(cfg.pipeline_from) if cfg.pipeline_from else 0
    state: dict[str, Any] = json.loads(state_path.read_text()) if start and state_path.exists() else {}
    if start and any(s not in state for s in STAGES[:start]):
        missing = [s for s in STAGES[:start] if s not in state]
        raise ValueError(f"--from-stage {cfg.pipeline_from}: {state_path} has no result of {', '.join(missing)}: "
                         "run from an earlier stage")  # fmt: skip
    if not start:
        for stale in ("runs", "decode.jsonl", "bench-float32", "bench-bfloat16"):
            shutil.rmtree(run / stale, ignore_errors=True) if (run / stale).is_dir() else (
                run / stale
            ).unlink(missing_ok=True)
        log.unlink(missing_ok=True)
    fns = {
        "install": lambda: stage_install(cfg, run, log),
        "sft": lambda: stage_train("train-proposer", "sft", cfg, run, log),
        "mars": lambda: stage_mars(cfg, run, log),
        "verifier": lambda: stage_train("train-verifier", None, cfg, run, log),
        "cpu-adam": lambda: stage_cpu_adam(cfg, run, log),
        "decode": lambda: stage_decode(cfg, run, log),
        "bench": lambda: stage_bench(cfg, run, log),
    }
    for name in STAGES[start:]:
        print(f"gpu-check: pipeline {name} …", file=sys.stderr, flush=True)
        try:
            ok, res = fns[name]()
        except Exception as e:  # a stage's own failure: recorded, the next stages still try
            ok, res = False, {"error": f"{type(e).__name__}: {e}"}
        state[name] = {"ok": ok, **res}
        state_path.write_text(json.dumps(state, indent=1) + "\n")
    for name in STAGES:
        s = state[name]
        checks.append(check_entry(f"pipeline {name}: {PIPELINE_CHECKS[name]}", s["ok"], s.get("error")))
    return {"stages": state, "from_stage": cfg.pipeline_from, "log": str(log), "settings": cfg.pipeline}


PIPELINE_CHECKS = {
    "install": "hydra and DeepSpeed importable (installed, or from wheelhouse/ with no index)",
    "sft": "make train-proposer STAGES=sft, deepspeed=zero3, ran every step",
    "mars": "MARS killed after its first checkpoint, the same command resumed there and finished",
    "verifier": "make train-verifier: verifier SFT, then distillation on the proposer's outputs",
    "cpu-adam": "deepspeed=zero3_offload_optimizer: CPU Adam built and stepped, or refused in one line",
    "decode": "prove-decode of the MARS checkpoint (prove-lossless) wrote every record",
    "bench": "prove-bench fp32: ar, prove-lossless unfused and fused equal transformers' generate",
}

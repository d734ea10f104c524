"""Fixtures for prove.train: generated arithmetic conversations."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def arithmetic_jsonl(tmp_path_factory) -> Path:
    """256 generated arithmetic conversations (prove.data.synthetic)."""
    from prove.data.synthetic import main

    out = tmp_path_factory.mktemp("arith")
    main(["--out", str(out), "--n", "256", "--test-size", "16", "--seed", "0"])
    return out / "train.jsonl"

"""Fixtures for prove.data tests: datasets' cache in a temp folder, and the shipped Dolci sample."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path_factory, monkeypatch):
    """Keep the Arrow files `datasets` writes for local JSON/parquet loads out of the user's cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))


@pytest.fixture(scope="session")
def sample_path():
    from prove.data.samples import DOLCI_SAMPLE

    return DOLCI_SAMPLE

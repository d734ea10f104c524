"""Hydra config group `stage` of prove-train (pkg://prove.conf/stage)."""

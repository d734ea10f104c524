"""Hydra config group `trainer` of prove-train (pkg://prove.conf/trainer)."""

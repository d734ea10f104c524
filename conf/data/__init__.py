"""Hydra config group `data` of prove-train (pkg://prove.conf/data)."""

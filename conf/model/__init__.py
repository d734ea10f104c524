"""Hydra config group `model` of prove-train (pkg://prove.conf/model)."""

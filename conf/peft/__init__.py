"""Hydra config group `peft` of prove-train (pkg://prove.conf/peft)."""

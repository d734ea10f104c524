"""Hydra config group `deepspeed` of prove-train (pkg://prove.conf/deepspeed)."""

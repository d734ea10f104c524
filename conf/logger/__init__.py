"""Hydra config group `logger` of prove-train (pkg://prove.conf/logger)."""

"""Hydra configs shipped inside the wheel (pkg://prove.conf)."""

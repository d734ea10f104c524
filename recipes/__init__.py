"""Whole-pipeline recipe overlays shipped inside the wheel (pkg://prove.recipes)."""

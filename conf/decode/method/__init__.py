"""Decoding methods: one YAML per method with its default parameters (mirrors prove.decode.methods)."""

"""prove-decode configs: decode.yaml (the primary config) and method/ (one YAML per method)."""

"""Bundled data: model configs, GPU specs, provider features, offer snapshot."""

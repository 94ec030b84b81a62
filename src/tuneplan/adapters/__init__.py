"""Adapters: all I/O (hub, store, importers, probe)."""

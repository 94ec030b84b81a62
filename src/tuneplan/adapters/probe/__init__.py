"""Measuring harness (optional extra: torch, transformers, peft)."""

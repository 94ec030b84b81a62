"""Money: billing, storage, egress, checkpoints and spot interruptions."""

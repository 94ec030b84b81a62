"""Launch bundles rendered as text from a plan (accelerate, DeepSpeed, SkyPilot, dstack)."""

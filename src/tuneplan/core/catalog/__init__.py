"""GPU specs, GPU names, providers and the offer catalog (pure records and queries)."""

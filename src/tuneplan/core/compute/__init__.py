"""Training speed: FLOPs, step time, communication, tokens/s and MFU."""

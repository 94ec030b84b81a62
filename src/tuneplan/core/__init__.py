"""The pure core: no files, network, environment, clock or printing; stdlib and core only."""

"""Plans: strategy search per offer, costing, ranking and the fit solver."""

"""The one description of a training job: Strategy, Job, methods, recipes, adapter targets."""

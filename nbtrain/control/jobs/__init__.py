"""One-off jobs on a model or a run: preview, evaluate, grade, export, serve."""

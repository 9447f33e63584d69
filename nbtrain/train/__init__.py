"""Training inside a ``%%distributed`` cell: prepare(), AMP, gradient accumulation, checkpoints (see docs/training.md)."""

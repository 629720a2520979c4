"""Trainer-side pieces plugged into verl's v1 trainer (and, next, the per-agent trainer)."""

"""Experiments the recipes run: comparisons of trainers and baselines, their tables and plots."""

"""Test support (not on the scoring path): tiny random checkpoints of every family."""

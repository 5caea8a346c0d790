"""Checks of the engine against independent references (not on the scoring path): parity with transformers."""

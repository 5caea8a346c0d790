"""Prompt packs and calibration: the pack format, the registry, expanding a pack into queries and applying its answers, order averaging, calibration maps and reports."""

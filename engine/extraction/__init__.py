"""Extraction slots ({*} {n} {$}): slot specs, the K/V kept from the read, decoding passes, decoders."""

"""Loading: served model names, GGUF conversion, checkpoints, weight quantization."""

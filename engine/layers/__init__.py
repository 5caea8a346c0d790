"""Layers the model stacks share: batch-invariant ops, tree attention (CPU and CUDA), decode attention, parameter modules."""

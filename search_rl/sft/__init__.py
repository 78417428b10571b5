"""The supervised warm start: examples from synthesised trajectories, its config and its loop (``main_sft``)."""

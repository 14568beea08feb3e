"""The overlay on an installed vLLM: apply, verify, revert, the runtime guard, the packed wheel."""

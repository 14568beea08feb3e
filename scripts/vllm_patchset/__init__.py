"""vllm-patchset: bug fixes carried on top of a pinned vLLM release."""

__version__ = "0.1.0"

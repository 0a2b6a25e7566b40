"""sweetspot: an adaptive concurrency gateway for LLM inference servers."""

__version__ = "0.1.0"

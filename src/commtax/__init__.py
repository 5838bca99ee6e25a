"""commtax: predict, simulate, measure and reduce the communication tax of distributed LLM training."""

__version__ = "0.1.0"

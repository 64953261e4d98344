"""Vigil: real-time multimodal stream analysis server."""

__version__ = "0.1.0"

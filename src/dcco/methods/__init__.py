"""Pretraining methods: DCCO and the baselines of the paper. See ``registry.py``."""

from dcco.methods.base import Method, Segments
from dcco.methods.registry import METHODS, build_method

__all__ = ["METHODS", "Method", "Segments", "build_method"]

"""Pretraining methods: DCCO and the baselines of the paper. See ``registry.py``."""

from dcco.methods.base import LossConfig, Method, Segments
from dcco.methods.registry import METHODS, build_method

__all__ = ["METHODS", "LossConfig", "Method", "Segments", "build_method"]

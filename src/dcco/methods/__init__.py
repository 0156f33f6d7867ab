"""Pretraining methods: DCCO and the baselines of the paper. See ``registry.py``."""

from dcco.methods.base import Method, Segments
from dcco.methods.registry import METHODS, build_method
from dcco.moved import moved_names

__all__ = ["METHODS", "Method", "Segments", "build_method"]


__getattr__ = moved_names(__name__)  # old names of dcco.config's classes, warned

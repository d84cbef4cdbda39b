"""Dialect front ends: MSL (`metal`) and CUDA (`cuda`) bodies onto one generated unit."""

from .tokens import identifiers

__all__ = ["identifiers"]

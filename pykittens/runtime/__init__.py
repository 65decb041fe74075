"""Binding user arguments to a kernel's signature, and launching (emulator or GPU)."""
from .args import bind_args

__all__ = ["bind_args"]

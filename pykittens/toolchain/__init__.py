"""LLVM IR -> code objects (hsaco for CDNA, cubin for Hopper), isolated and cached."""
from .isolate import ToolchainError, run_isolated

__all__ = ["ToolchainError", "run_isolated"]

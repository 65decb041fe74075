"""LLVM IR -> code objects (hsaco for CDNA, cubin for Hopper), isolated and cached; `tools`
says which of the tools this machine has."""
from .isolate import ToolchainError, run_isolated
from .tools import ToolMissing

__all__ = ["ToolchainError", "ToolMissing", "run_isolated"]

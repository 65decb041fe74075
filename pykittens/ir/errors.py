"""The one error type users see from kernel code: it names the user's file and line."""
from __future__ import annotations


class KernelError(Exception):
    def __init__(self, message: str, loc=None, kernel: str | None = None):
        self.message, self.loc, self.kernel = message, loc, kernel
        where = f"{loc}: " if loc else ""
        who = f"[kernel {kernel}] " if kernel else ""
        super().__init__(f"{where}{who}{message}")


class NotSupportedYet(KernelError):
    """A feature that exists in the IR but whose lowering for a target is not built yet."""

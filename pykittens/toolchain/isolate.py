"""Run a compile step in a child process, so an LLVM abort cannot kill the caller.

`run_isolated("pkg.module:function", payload)` imports the function in a fresh Python
process, calls it with `payload` (picklable) and returns its (picklable) result. If the child
dies (abort, segfault) or raises, the parent gets a ToolchainError whose message names the
step, the exit status, the child's stderr tail, and where the input was saved.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile


class ToolchainError(RuntimeError):
    pass


_CHILD = r"""
import importlib, pickle, sys, traceback
mod, fn = sys.argv[1].split(":")
payload = pickle.load(sys.stdin.buffer)
try:
    out = ("ok", getattr(importlib.import_module(mod), fn)(payload))
except BaseException as e:
    out = ("err", f"{type(e).__name__}: {e}\n" + traceback.format_exc())
sys.stdout.buffer.write(pickle.dumps(out))
"""


def run_isolated(func: str, payload, *, what: str, save_text: str | None = None,
                 save_suffix: str = ".ll", timeout: float = 600):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _CHILD, func], input=pickle.dumps(payload),
                          capture_output=True, env=env, timeout=timeout)
    result = None
    if proc.returncode == 0 and proc.stdout:
        try:
            result = pickle.loads(proc.stdout)
        except Exception:
            result = None
    if result is not None and result[0] == "ok":
        return result[1]
    saved = ""
    if save_text is not None:
        fd, path = tempfile.mkstemp(prefix="pykittens-failed-", suffix=save_suffix)
        with os.fdopen(fd, "w") as f:
            f.write(save_text)
        saved = f"; the input was saved to {path}"
    if result is not None:
        detail = result[1].strip().splitlines()
        msg = detail[0] if detail else "error"
        raise ToolchainError(f"{what} failed: {msg}{saved}")
    tail = proc.stderr.decode(errors="replace").strip()[-2000:]
    raise ToolchainError(f"{what} crashed the compiler process (exit status "
                         f"{proc.returncode}){saved}\n{tail}")

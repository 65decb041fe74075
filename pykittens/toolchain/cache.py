"""On-disk cache of code objects, keyed by everything that determines the bytes."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """$PYKITTENS_CACHE, else $XDG_CACHE_HOME/pykittens, else ~/.cache/pykittens."""
    env = os.environ.get("PYKITTENS_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pykittens"


def cache_key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:32]


def lookup(kind: str, key: str) -> bytes | None:
    p = cache_dir() / kind / key
    try:
        return p.read_bytes()
    except OSError:
        return None


def store(kind: str, key: str, data: bytes) -> Path:
    """Write atomically (rename), so concurrent compiles never see half a file."""
    d = cache_dir() / kind
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, d / key)
    return d / key

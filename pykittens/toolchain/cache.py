"""On-disk cache of code objects, keyed by everything that determines the bytes.

Every key includes the cache format and pykittens' own version on top of what the caller
passes (the input text, the target, the compiler passes and flags, the toolchain versions).
Every entry carries a header with its length and SHA-256: a truncated, corrupted or
foreign file is detected on lookup, removed, and reported as a miss, so the caller rebuilds
it. Writers write a temporary file in the same directory and rename it into place, so
readers (other threads or processes) see either no entry or a whole one.
"""
from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile
from pathlib import Path

FORMAT = 2                     # bump when the entry layout or the key scheme changes
_MAGIC = b"PKC\x02"
_HEADER = struct.Struct("<4sQ32s")     # magic, payload length, sha256(payload)


def cache_dir() -> Path:
    """$PYKITTENS_CACHE, else $XDG_CACHE_HOME/pykittens, else ~/.cache/pykittens."""
    env = os.environ.get("PYKITTENS_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pykittens"


def pykittens_version() -> str:
    """The running pykittens' version (the package's own, else the installed metadata)."""
    v = getattr(sys.modules.get("pykittens"), "__version__", None)
    if v:
        return str(v)
    try:
        import importlib.metadata
        return importlib.metadata.version("pykittens")
    except Exception:
        return "unknown"


def cache_key(*parts: str | bytes) -> str:
    """A hex key over `parts` (each length-prefixed, so no two part lists collide), the
    cache format and the pykittens version."""
    h = hashlib.sha256()
    for p in (f"pykittens-cache-{FORMAT}", pykittens_version()) + parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    return h.hexdigest()[:40]


def encode(data: bytes) -> bytes:
    """An entry: header (magic, length, checksum) + payload."""
    data = bytes(data)
    return _HEADER.pack(_MAGIC, len(data), hashlib.sha256(data).digest()) + data


def decode(raw: bytes) -> bytes | None:
    """The payload of an entry, or None when it is truncated, corrupted or not an entry."""
    if len(raw) < _HEADER.size:
        return None
    magic, n, digest = _HEADER.unpack_from(raw)
    data = raw[_HEADER.size:]
    if magic != _MAGIC or n != len(data) or hashlib.sha256(data).digest() != digest:
        return None
    return data


def lookup(kind: str, key: str) -> bytes | None:
    """The payload stored under (kind, key), or None (missing, or corrupt: then removed so
    the caller's rebuild replaces it)."""
    p = cache_dir() / kind / key
    try:
        raw = p.read_bytes()
    except OSError:
        return None
    data = decode(raw)
    if data is None:
        try:
            p.unlink()
        except OSError:
            pass
    return data


def store(kind: str, key: str, data: bytes) -> Path:
    """Write atomically (a temporary file renamed into place), so concurrent compiles never
    see half a file; the last writer wins, and all writers write the same bytes."""
    d = cache_dir() / kind
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{key}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / key)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return d / key

"""Element arithmetic with the rounding the hardware does: compute in f32, round once to the
register's type (round to nearest even); conversions to fp8 and int8 saturate."""
from __future__ import annotations

import numpy as np

from ..ir import types as T


def to_dtype(x: np.ndarray, d: T.DType) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.dtype(d.np):
        return x
    if d == T.boolean:
        return x.astype(np.bool_)
    if d.is_float:
        if d.is_fp8:
            m = T.fp8_max(d)
            x = np.clip(x.astype(np.float32), -m, m)
        return x.astype(d.np)
    if np.dtype(x.dtype).kind == "f" or x.dtype.name in ("bfloat16",) or \
            x.dtype.name.startswith("float8"):
        f = np.nan_to_num(np.rint(x.astype(np.float64)), nan=0.0)
        info = np.iinfo(d.np)
        return np.clip(f, info.min, info.max).astype(d.np)
    if x.dtype == np.bool_:
        return x.astype(d.np)
    info = np.iinfo(d.np)                      # integer narrowing saturates too
    return np.clip(x.astype(np.int64), info.min, info.max).astype(d.np)


def _wide(x):
    x = np.asarray(x)
    if x.dtype.kind in "iub":
        return x.astype(np.int64)
    return x.astype(np.float32)


_BIN = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "max": np.fmax, "min": np.fmin,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shl": np.left_shift, "shr": np.right_shift,
}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def binary(op: str, a, b, d: T.DType):
    if d == T.boolean:
        return _BIN[op](np.asarray(a, bool), np.asarray(b, bool))
    wa, wb = _wide(a), _wide(b)
    if op == "div":
        if d.is_float:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.divide(wa.astype(np.float32), wb.astype(np.float32))
        else:
            if np.any(wb == 0):
                raise ZeroDivisionError("integer division by zero")
            r = np.floor_divide(wa, wb)
    elif op == "floordiv":
        if np.any(wb == 0):
            raise ZeroDivisionError("integer division by zero")
        r = np.floor_divide(wa, wb)
    elif op == "mod":
        if np.any(wb == 0):
            raise ZeroDivisionError("integer modulo by zero")
        r = np.mod(wa, wb)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            r = _BIN[op](wa, wb)
    return to_dtype(r, d)


def compare(op: str, a, b):
    return _CMP[op](_wide(a), _wide(b))


def unary(op: str, a, d: T.DType):
    x = np.asarray(a).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = {"exp2": np.exp2, "log2": np.log2, "sqrt": np.sqrt, "abs": np.abs,
             "neg": np.negative,
             "rsqrt": lambda v: np.float32(1) / np.sqrt(v),
             "recip": lambda v: np.float32(1) / v}[op](x)
    return to_dtype(r.astype(np.float32), d)

"""pykittens: a Python tile DSL for AI kernels on AMD CDNA3/CDNA4, portable to NVIDIA Hopper.

    import pykittens as pk

    @pk.kernel(num_waves=4)
    def scale(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], alpha: pk.f32):
        r0 = (pk.program_id(0) * pk.num_waves() + pk.wave_id()) * 4
        t = pk.load(pk.rt((4, 64), pk.f32), x, (r0, 0))
        pk.store(out, t * alpha, (r0, 0))
"""
from .ir.errors import KernelError, NotSupportedYet
from .ir.types import (bf16, dtype_of, e2m1x2, e2m3p, e3m2p, e4m3, e4m3fnuz, e5m2, e5m2fnuz,
                       e8m0, f16, f32, i8, i32)
from .lang.kernel import Kernel, Peers, const, gl, kernel, peers, target
from .lang.ops import any_ as any  # noqa: A004 (pk.any: the vote)
from .lang.ops import (abs, add, atomic_add, barrier, cast, cluster, cluster_rank, cluster_sum,
                       col_index, col_max, col_sum, convert, copy, discard, div, else_, empty,
                       exp2, fill, fma, full, if_, lane_id, load, log2, log2_e,
                       mask_outside, max, min, mma_AB, mma_ABt, mma_AtB, mma_wait, mul,
                       num_programs, num_waves, program_id, programs_per_cu, range, relabel,
                       row_index, row_max, row_sum, rsqrt, rt, rv, setprio, sqrt, st,
                       static_range, store, sub, subtile, transpose, wave_id, workgroup_max,
                       workgroup_sum, xor_cols, zeros)
from .lang.pipeline import Ring, StagedStore
from .lang.schedule import (StreamWalk, interleave, pingpong, sched_barrier, sched_group,
                            stream_walk, tile_walk, waitcnt)
from .lang.sync import (arrive, cluster_sync, mbarrier, role, signal, timestamp, tma_load,
                        tma_store, tma_store_wait, wait, wait_flag)
from .lang.values import maximum, minimum, where
__version__ = "0.1.0"

# pk.emulate and pk.launch load the emulator and the runtime on first use, so that
# `import pykittens` (what every kernel module does) loads the language alone.
_DEFERRED = {"emulate": ".emulator.launch", "emulate_world": ".emulator.launch",
             "launch": ".runtime.launch"}


def __getattr__(name):
    if name in _DEFERRED:
        import importlib
        value = getattr(importlib.import_module(_DEFERRED[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_DEFERRED))

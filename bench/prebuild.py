"""Fill the code-object cache ($PYKITTENS_CACHE) with the PTX of every build a GPU script will
launch, on a machine without a GPU, so a short GPU session spends its time on the GPU:

    PYKITTENS_CACHE=$PWD/.pkcache python3 bench/prebuild.py attention
then carry .pkcache to the GPU machine and run with the same PYKITTENS_CACHE."""
from __future__ import annotations

import itertools
import sys
import time

from pykittens import compiler
from pykittens.toolchain import nvptx


def ptx(builds, target: str = "sm_90a") -> int:
    """Compile the PTX of each distinct (kernel, constants) of `builds` (aligned) into the
    cache, printing how many and how long; 0 (a script's exit status)."""
    t0, seen = time.time(), set()
    for kernel, consts in builds:
        key = (kernel.name, repr(sorted(consts.items())))
        if key not in seen:
            seen.add(key)
            nvptx.compile_ptx(compiler.llvm_ir(kernel, target, aligned=True, **consts), target)
    print(f"{len(seen)} builds in {time.time() - t0:.0f} s")
    return 0


def attention():
    import numpy as np
    from pykittens.kernels.attention import attention_fwd, attention_fwd_launch, hopper_schedules
    for dt, d, causal in itertools.product(("bf16", "f16"), (64, 128), (0, 1)):
        shapes = {n: np.empty((1, 8, 256, d), np.float16) for n in "qkv"}
        for over in hopper_schedules(d).values():
            if causal and over.get("PERSISTENT"):
                continue
            yield attention_fwd, {"DT": dt, **attention_fwd_launch(shapes, "sm_90a",
                                                                   CAUSAL=causal, **over)[1]}


def attention_bwd():
    """The forward's default build and every backward pass, as pykittens.ops.attention's
    autograd launches them."""
    import numpy as np
    from pykittens.kernels.attention import attention_fwd, attention_fwd_launch
    from pykittens.kernels.attention_bwd import (attention_bwd, attention_bwd_dq,
                                                 attention_bwd_dq_finish, attention_bwd_launch,
                                                 attention_bwd_prep)
    for dt, d, causal in itertools.product(("bf16", "f16"), (64, 128), (0, 1)):
        shapes = {n: np.empty((1, 8, 256, d), np.float16) for n in "qkv"}
        yield attention_fwd, {"DT": dt, **attention_fwd_launch(shapes, "sm_90a",
                                                               CAUSAL=causal)[1]}
        for dq, nq in itertools.product(("pass", "atomic"), (256, 130)):  # 130: STATS_TMA=0
            shapes["q"] = np.empty((1, 8, nq, d), np.float16)
            plans = attention_bwd_launch(shapes, "sm_90a", dq=dq, CAUSAL=causal)
            third = attention_bwd_dq_finish if dq == "atomic" else attention_bwd_dq
            for kernel, plan in zip((attention_bwd_prep, attention_bwd, third), plans):
                yield kernel, {"DT": dt, **plan[1]}


def attention_varlen():
    """pykittens.ops.attention_varlen's forward and backward builds (bench/attention_bwd.py
    step "varlen"): dQ added into the sum and finished, or by its own pass."""
    import numpy as np
    from pykittens.kernels.attention import attention_fwd_varlen, attention_fwd_varlen_launch
    from pykittens.kernels.attention_bwd import (attention_bwd_dq_finish_varlen,
                                                 attention_bwd_dq_varlen, attention_bwd_prep,
                                                 attention_bwd_varlen,
                                                 attention_bwd_varlen_launch)
    import attention_bwd as bench               # bench/, this script's directory
    cu = np.array([0, 100, 256], np.int32)
    for dt, d, causal, late in itertools.product(("bf16",), (64, 128), (0, 1), (True, False)):
        i = {"q": np.empty((8, 256, d), np.float16), "k": np.empty((8, 256, d), np.float16),
             "v": np.empty((8, 256, d), np.float16), "cu_seqlens_q": cu, "cu_seqlens_k": cu}
        with bench.late_walk(late):               # both walks: the varlen step compares them
            yield attention_fwd_varlen, {"DT": dt, **attention_fwd_varlen_launch(
                i, "sm_90a", CAUSAL=causal)[1]}
            for dq, third in (("pass", attention_bwd_dq_varlen),
                              ("atomic", attention_bwd_dq_finish_varlen)):
                plans = attention_bwd_varlen_launch(i, "sm_90a", CAUSAL=causal, dq=dq)
                for kernel, plan in zip((attention_bwd_prep, attention_bwd_varlen, third), plans):
                    yield kernel, {"DT": dt, **plan[1]}


def attention_bwd_passes():
    """The pass variants bench/attention_bwd.py times alone (step "passes")."""
    import attention_bwd as bench               # bench/, this script's directory
    from pykittens.kernels.attention_bwd import attention_bwd_dq_finish
    for shape in bench.PASS_SHAPES:
        for _, kernel, _, consts in bench.pass_plans(shape):
            yield kernel, consts
        yield attention_bwd_dq_finish, {"DT": "f32", "D": shape[4],    # dQ's sums compared
                                        "TARGET": "sm_90a"}


def chiplet_l2():
    """gemm_ws under every tile order bench/chiplet_l2.py measures."""
    import chiplet_l2 as bench
    from pykittens.kernels import KERNELS
    for case in bench.cases():
        yield KERNELS["gemm_ws"].kernel, bench.plan(*case)[1]


def chiplet_attention():
    """attention_fwd under every order bench/chiplet_attention.py measures."""
    import chiplet_attention as bench
    from pykittens.kernels.attention import attention_fwd
    for case in bench.cases():
        yield attention_fwd, bench.plan(*case)[1]


RAGGED = ("attention_bwd", "attention_varlen")


def main() -> int:
    t0, n = time.time(), 0
    for family in sys.argv[1:] or ["attention"]:
        # ragged shapes (a sequence length not a multiple of 16) take the unaligned build
        for kernel, consts in globals()[family]():
            for aligned in (True, False) if family in RAGGED else (True,):
                nvptx.compile_ptx(compiler.llvm_ir(kernel, "sm_90a", aligned=aligned, **consts),
                                  "sm_90a")
                n += 1
    print(f"{n} builds in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

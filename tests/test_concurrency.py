"""Tracing, lowering, rendering, emulating and compiling from several threads at once give
what one thread gives: each thread traces on its own tracer stack, a kernel traces each
set of constants once, and code objects go through the disk cache whole."""
import functools
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels import KERNELS

JOBS = [(name, target, consts) for name, consts in (
    ("scaled_add", {"DT": "bf16"}), ("scaled_add", {"DT": "f32"}),
    ("softmax", {"DT": "bf16"}), ("softmax", {"DT": "f32"}),
    ("layernorm", {"DT": "bf16"}), ("layernorm", {"DT": "f32", "RESIDENT": 1, "N_MAX": 1024,
                                                   "CHUNK": 512}),
    ("gemm_basic", {"DT": "bf16", "OUT": "f32"}), ("gemm_basic", {"DT": "f16", "OUT": "f32"}))
    for target in ("gfx942", "gfx950", "sm_90a")]


def fresh(name):
    """A new Kernel over a library function: nothing cached, so every call traces."""
    k = KERNELS[name].kernel
    return pk.kernel(k.fn, num_waves=k.num_waves)


def llvm(job):
    name, target, consts = job
    return compiler.llvm_ir(fresh(name), target, **consts)


@pytest.fixture
def busy_switching():
    """Switch threads as often as the interpreter can, so traces interleave op by op."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_concurrent_traces_render_what_a_serial_run_renders(busy_switching):
    serial = [llvm(j) for j in JOBS]
    with ThreadPoolExecutor(8) as ex:
        concurrent = list(ex.map(llvm, JOBS * 3))
    bad = [JOBS[i % len(JOBS)][:2] for i, ir in enumerate(concurrent)
           if ir != serial[i % len(JOBS)]]
    assert not bad, f"{len(bad)} of {len(concurrent)} concurrent traces differ: {bad[:4]}"


def test_one_kernel_traces_each_constant_set_once(busy_switching):
    calls = []
    spec = KERNELS["softmax"].kernel

    @functools.wraps(spec.fn)
    def fn(*a, **kw):
        calls.append(threading.get_ident())
        return spec.fn(*a, **kw)

    k = pk.kernel(fn, num_waves=spec.num_waves)
    barrier = threading.Barrier(8)

    def go(_):
        barrier.wait()
        return k.specialize(DT="bf16")

    with ThreadPoolExecutor(8) as ex:
        irs = list(ex.map(go, range(8)))
    assert len(calls) == 1 and all(ir is irs[0] for ir in irs)


def test_concurrent_emulation_matches_serial(busy_switching):
    rng = np.random.default_rng(3)
    cases = []
    for name in ("scaled_add", "softmax", "layernorm"):
        spec = KERNELS[name]
        for target in ("gfx950", "sm_90a"):
            inputs = spec.make_inputs((37, 100), pk.f32, rng)
            grid, consts = spec.launch(inputs, target)
            cases.append((name, target, inputs, grid, consts))

    def run(case):
        name, target, inputs, grid, consts = case
        return pk.emulate(fresh(name), grid=grid, target=target, **inputs, **consts)

    serial = [run(c) for c in cases]
    with ThreadPoolExecutor(6) as ex:
        got = list(ex.map(run, cases * 2))
    for i, res in enumerate(got):
        want = serial[i % len(cases)]
        for k in want:
            assert np.array_equal(res[k], want[k], equal_nan=True), (cases[i % len(cases)][:2], k)


@pytest.mark.usefixtures("module_cache")
def test_concurrent_compiles_match_serial():
    """Code objects built by four threads at once (child processes, one disk cache) are
    byte for byte what a serial build gives."""
    jobs = [("scaled_add", t, {"DT": "bf16"}) for t in ("gfx942", "sm_90a")] + \
        [("softmax", t, {"DT": "f32"}) for t in ("gfx950", "sm_90a")]

    def build(job):
        name, target, consts = job
        obj = compiler.code_object(fresh(name), target, **consts)
        return obj if isinstance(obj, bytes) else (obj["ptx"], obj["cubin"])

    with ThreadPoolExecutor(4) as ex:
        concurrent = list(ex.map(build, jobs * 2))
    serial = [build(j) for j in jobs]                 # now from the cache: whole entries
    for i, obj in enumerate(concurrent):
        assert obj == serial[i % len(jobs)], jobs[i % len(jobs)][:2]

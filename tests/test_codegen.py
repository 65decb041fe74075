"""The LLVM IR renderer: every library kernel renders to IR that LLVM verifies and compiles
for all three targets, with the instructions the lowering meant."""
import re

import llvmlite.binding as llvm
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels import KERNELS
from pykittens.targets import NAMES

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()


def _asm(ir: str, target: str) -> str:
    mod = llvm.parse_assembly(ir)
    mod.verify()
    triple = "nvptx64-nvidia-cuda" if target == "sm_90a" else "amdgcn-amd-amdhsa"
    feats = "+ptx84" if target == "sm_90a" else ""
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=target, opt=3,
                                                               features=feats)
    return tm.emit_assembly(mod)


@pytest.mark.parametrize("name,target", [(n, t) for n, s in KERNELS.items() for t in s.targets])
def test_library_kernel_compiles(name, target):
    spec = KERNELS[name]
    ir = compiler.llvm_ir(spec.kernel, target, **spec.compile_consts)
    asm = _asm(ir, target)
    if target == "sm_90a":
        assert f".entry {name}" in asm and ".target sm_90a" in asm
        assert ".extern .func" not in asm           # no misspelled intrinsic became a call
        if name not in ("tma_scale", "gemm_ws"):    # (their loads are all TMA)
            assert "ld.global" in asm and "st.global" in asm
        if name in ("softmax", "layernorm"):
            assert "shfl.sync.bfly" in asm          # row reductions cross lanes
        if name == "tma_scale":
            assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in asm
        if name == "ws_scale":
            assert "mbarrier.try_wait.parity" in asm and "setmaxnreg.dec" in asm
        if name == "gemm_basic":
            assert "mma.sync.aligned.m16n8k16" in asm
        if name == "gemm_wgmma":
            assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in asm
        if name == "gemm_ws":                       # both operands by descriptor, K-major
            assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s+"
                             r"\{[^}]*\}, %rd\d+, %rd\d+, p, 1, 1, 0, 0;", asm)
            # A's two 64-row blocks and B's block, once: the ring stage is picked at run time
            assert asm.count("cp.async.bulk.tensor.2d.shared::cluster.global") == 3
            assert "setmaxnreg.dec.sync.aligned.u32 40" in asm
            assert "setmaxnreg.inc.sync.aligned.u32 232" in asm
    else:
        assert f".amdgcn_target \"amdgcn-amd-amdhsa--{target}\"" in asm
        assert re.search(r"\.private_segment_fixed_size:\s+0", asm)     # no scratch / spills
        if name == "gemm_pingpong":           # memory -> LDS by DMA (dwords on gfx942)
            assert re.search(r"buffer_load_dword\w* .* lds", asm)
        else:
            assert "buffer_load_dwordx2" in asm or "buffer_load_dwordx4" in asm  # vector runs
        if name in ("softmax", "layernorm"):  # butterflies: DPP in quads, ds_swizzle beyond
            assert "quad_perm:[1,0,3,2]" in asm and "ds_swizzle_b32" in asm
        if name in ("gemm_basic", "gemm_pingpong"):
            assert "v_mfma_f32_32x32" in asm


def test_kernel_arguments_follow_the_abi():
    ir = compiler.llvm_ir(KERNELS["layernorm"].kernel, "gfx950", DT="bf16")
    head = next(line for line in ir.splitlines() if line.startswith("define"))
    names = re.findall(r"%([\w.]+)", head)
    assert names == ["x", "x.size0", "x.size1", "x.stride0", "x.stride1", "w", "w.size0",
                     "w.stride0", "b", "b.size0", "b.stride0", "out", "out.size0", "out.size1",
                     "out.stride0", "out.stride1", "stats", "stats.size0", "stats.size1",
                     "stats.stride0", "stats.stride1", "eps"]
    assert '"amdgpu-flat-work-group-size"="256,256"' in ir


def test_loops_are_real_loops_in_llvm_ir():
    ir = compiler.llvm_ir(KERNELS["softmax"].kernel, "sm_90a", DT="f32")
    assert len(re.findall(r"^loop\d+:", ir, re.M)) == 2
    assert " phi " in ir


@pk.kernel(num_waves=2)
def _staged(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    s = pk.empty(pk.st((32, 64), pk.f32, swizzle=4))
    pk.load(s, x, (0, 0))
    pk.barrier()
    pk.setprio(2)
    with pk.if_(pk.wave_id() == 0):
        t = pk.load(pk.rt((32, 64), pk.f32), s, (0, 0))
        pk.store(out, pk.exp2(t), (0, 0))
    pk.setprio(0)


def test_shared_memory_barrier_and_priority_render():
    amd = _asm(compiler.llvm_ir(_staged, "gfx942"), "gfx942")
    assert "s_barrier" in amd and "s_setprio 2" in amd and "ds_write" in amd and "ds_read" in amd
    assert re.search(r"\.group_segment_fixed_size:\s+8192", amd)
    ptx = _asm(compiler.llvm_ir(_staged, "sm_90a"), "sm_90a")
    assert "barrier.sync" in ptx and "ld.shared" in ptx and "st.shared" in ptx
    assert ".extern .shared" in ptx               # dynamic shared memory, sized at launch


def test_the_emulator_runs_the_same_staged_kernel():
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    for target in NAMES:
        out = pk.emulate(_staged, x, np.zeros_like(x), grid=1, target=target)["out"]
        np.testing.assert_allclose(out, np.exp2(x), rtol=1e-6)


def test_fp8_rendering_says_not_supported_yet():
    @pk.kernel
    def to_fp8(x: pk.gl[pk.f32, 2], out: pk.gl[pk.e4m3, 2]):
        pk.store(out, pk.load(pk.rt((1, 64), pk.f32), x, (0, 0)), (0, 0))

    with pytest.raises(pk.NotSupportedYet, match="fp8"):
        compiler.llvm_ir(to_fp8, "gfx950")


@pk.kernel(num_waves=4)
def _direct(x: pk.gl[pk.bf16, 2], out: pk.gl[pk.bf16, 2], SW: pk.const = 0):
    s = pk.empty(pk.st((64, 64), pk.bf16, swizzle=SW))
    pk.load(s, x, (pk.program_id(0) * 64, 0), direct=True)
    pk.barrier()
    t = pk.load(pk.rt((16, 64), pk.f32), s, (pk.wave_id() * 16, 0))
    pk.store(out, t, (pk.program_id(0) * 64 + pk.wave_id() * 16, 0))


@pytest.mark.parametrize("sw", [0, 8])
def test_direct_global_to_lds(sw):
    rng = np.random.default_rng(5)
    for shape in ((128, 64), (100, 50)):            # 50 columns: the uniform fallback path
        x = rng.standard_normal(shape).astype(pk.bf16.np)
        for target in NAMES:
            got = pk.emulate(_direct, x, np.zeros_like(x), grid=(-(-shape[0] // 64),),
                             target=target, SW=sw)["out"]
            assert np.array_equal(got, x)
    for target, instr in (("gfx942", "buffer_load_dword"), ("gfx950", "buffer_load_dwordx4")):
        ir = compiler.llvm_ir(_direct, target, SW=sw)
        # 64x64 bf16 over 256 lanes: 16-byte chunks -> 2 DMAs per lane; 4-byte -> 8
        dmas = ir.count("call void @llvm.amdgcn.raw.ptr.buffer.load.lds(")
        assert dmas == (2 if target == "gfx950" else 8)
        from pykittens.toolchain import amdgpu
        asm = amdgpu.disassemble(compiler.code_object(_direct, target, SW=sw), target)
        assert re.search(rf"{instr} v\d+, s\[\d+:\d+\], 0 offen lds", asm)


def test_direct_load_errors():
    @pk.kernel
    def bad(x: pk.gl[pk.f32, 2]):
        t = pk.empty(pk.rt((4, 64), pk.f32))
        pk.load(t, x, direct=True)

    with pytest.raises(pk.KernelError, match="direct=True applies to global -> shared loads"):
        bad.specialize()


def test_programs_per_cu_caps_registers():
    """pk.programs_per_cu(n) asks the compiler for n resident workgroups per SM / CU: PTX
    carries .minnctapersm n (ptxas then keeps a lane within 64K / (n x threads) registers),
    AMDGPU the waves per SIMD that n workgroups put there; without it, neither."""
    from pykittens.kernels.rows import staged_plan
    from pykittens.kernels.rmsnorm import rmsnorm_bwd
    _, consts = staged_plan(16384, 8192, "sm_90a", 2, 2, waves=8, programs=2)
    ptx = compiler.emit(rmsnorm_bwd, "sm_90a", "asm", DT=pk.bf16, RESIDUAL=0, **consts)
    assert re.search(r"\.minnctapersm 2\b", ptx)
    uncapped = {**consts, "PROGRAMS": 0}
    assert ".minnctapersm" not in compiler.emit(rmsnorm_bwd, "sm_90a", "asm", DT=pk.bf16,
                                                RESIDUAL=0, **uncapped)
    rep = compiler.report(rmsnorm_bwd, "sm_90a", DT=pk.bf16, RESIDUAL=0, **consts)
    if rep.get("registers") is not None:          # ptxas installed: the cap holds
        assert rep["registers"] <= 65536 // (2 * 8 * 32)

    @pk.kernel(num_waves=4)
    def capped(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        pk.programs_per_cu(3)
        pk.store(out, pk.load(pk.rt((16, 64), pk.f32), x, (0, 0)), (0, 0))

    assert '"amdgpu-waves-per-eu"="3"' in compiler.llvm_ir(capped, "gfx942")

    @pk.kernel(num_waves=4)
    def in_a_loop(x: pk.gl[pk.f32, 2]):
        for _ in pk.range(2):
            pk.programs_per_cu(2)

    with pytest.raises(pk.KernelError, match="top level"):
        compiler.llvm_ir(in_a_loop, "sm_90a")


def test_atomic_add_takes_vector_reductions_on_hopper():
    """pk.atomic_add of runs of 4 consecutive f32 inside the tensor: one red.global.add.v4.f32
    each on sm_90a (element by element only on the ragged edge); the sums agree with numpy in
    the emulator, rows past the tensor untouched."""
    @pk.kernel(num_waves=4)
    def add_twice(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
        r0 = pk.wave_id() * 16
        pk.atomic_add(out, pk.load(pk.rt((16, 64), pk.f32), x, (r0, 0)) * 2.0, (r0, 0))

    ptx = compiler.emit(add_twice, "sm_90a", "asm")
    assert len(re.findall(r"red\.global\.add\.v4\.f32", ptx)) == 8      # 32 f32 per lane
    x = np.random.default_rng(0).random((50, 64), dtype=np.float32)
    got = pk.emulate(add_twice, x, np.ones_like(x), grid=1)["out"]
    assert np.array_equal(got, 1 + 2 * x)


@pk.kernel(num_waves=1)
def _copy_rows(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], INSIDE: pk.const = 0):
    t = pk.load(pk.rt((16, 64), pk.f32), x, (pk.program_id(0) * 16, 0), inside=bool(INSIDE))
    pk.store(out, t * 2.0, (pk.program_id(0) * 16, 0), inside=bool(INSIDE))


@pytest.mark.parametrize("target", NAMES)
def test_inside_windows_check_no_bounds(target):
    """A window promised inside its tensor (inside=True) renders as its vector accesses
    alone: no edge path that reads or writes element by element; without the promise the
    edge path is there. Both compute the same where the promise holds, and the emulator
    reports a launch that breaks it."""
    checked = compiler.llvm_ir(_copy_rows, target, INSIDE=0)
    promised = compiler.llvm_ir(_copy_rows, target, INSIDE=1)
    assert "ld_edge" in checked and "st_edge" in checked
    assert "ld_edge" not in promised and "st_edge" not in promised
    _asm(promised, target)
    x = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    for inside in (0, 1):
        got = pk.emulate(_copy_rows, x, np.zeros_like(x), grid=(2,), target=target,
                         INSIDE=inside)["out"]
        assert np.array_equal(got, 2 * x)
    with pytest.raises(pk.KernelError, match="promised inside"):
        pk.emulate(_copy_rows, x[:20], np.zeros_like(x[:20]), grid=(2,), target=target,
                   INSIDE=1)
    pk.emulate(_copy_rows, x[:20], np.zeros_like(x[:20]), grid=(2,), target=target)


def test_inside_is_a_build_time_promise_on_global_windows():
    @pk.kernel(num_waves=1)
    def shared_inside(x: pk.gl[pk.f32, 2]):
        s = pk.empty(pk.st((16, 64), pk.f32))
        pk.load(s, x, (0, 0), inside=True)

    @pk.kernel(num_waves=1)
    def not_a_bool(x: pk.gl[pk.f32, 2]):
        pk.load(pk.rt((16, 64), pk.f32), x, (0, 0), inside=pk.program_id(0) == 0)

    x = np.zeros((16, 64), np.float32)
    with pytest.raises(pk.KernelError, match="inside=True promises a register window"):
        pk.emulate(shared_inside, x, grid=(1,), target="sm_90a")
    with pytest.raises(pk.KernelError, match="inside= is True or False"):
        pk.emulate(not_a_bool, x, grid=(1,), target="sm_90a")

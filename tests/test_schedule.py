"""Wave-scheduling primitives: 8-wave ping-pong and 4-wave interleave."""
import re

import llvmlite.binding as llvm
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.kernels.spec import rel_err
from pykittens.targets.cdna import waitcnt_imm

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()


@pk.kernel(num_waves=8)
def pingpong_gemm(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
                  BK: pk.const = 32):
    # 8 waves in two groups of 4; each wave owns a 32x32 output tile of a 128x64 block.
    w = pk.wave_id()
    m0 = pk.program_id(0) * 128 + (w // 2) * 32
    n0 = pk.program_id(1) * 64 + (w % 2) * 32
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
    ta = pk.empty(pk.rt((32, BK), pk.bf16, role="a"))
    tb = pk.empty(pk.rt((BK, 32), pk.bf16, role="b", layout="col"))
    with pk.pingpong() as pp:
        for k in pk.range((a.shape[1] + BK - 1) // BK):
            with pp.memory():
                pk.load(ta, a, (m0, k * BK))
                pk.load(tb, b, (k * BK, n0))
            with pp.compute():
                pk.mma_AB(acc, ta, tb)
                pk.interleave([("mfma", 1), ("valu", 2)], repeat=2)
    pk.store(c, acc, (m0, n0))


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_pingpong_gemm_is_correct_and_balanced(target, rng):
    m, n, k = 128, 64, 96
    a = rng.standard_normal((m, k)).astype(pk.bf16.np)
    b = rng.standard_normal((k, n)).astype(pk.bf16.np)
    out = pk.emulate(pingpong_gemm, a, b, np.zeros((m, n), np.float32), grid=(1, 1),
                     target=target)["c"]
    assert rel_err(out, a.astype(np.float64) @ b.astype(np.float64)) < 1e-5


def _asm(ir, target):
    mod = llvm.parse_assembly(ir)
    mod.verify()
    tm = llvm.Target.from_triple("amdgcn-amd-amdhsa").create_target_machine(cpu=target, opt=3)
    return tm.emit_assembly(mod)


def _loop_bodies(asm):
    lines = asm.splitlines()
    where = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.LBB\w+):", ln))}
    return ["\n".join(lines[where[m.group(1)]:i]) for i, ln in enumerate(lines)
            if (m := re.match(r"\s+s_(?:cbranch_\w+|branch)\s+(\.LBB\w+)", ln))
            and where.get(m.group(1), i) < i]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_pingpong_asm_has_priorities_and_barriers_in_the_loop(target):
    ir = compiler.llvm_ir(pingpong_gemm, target)
    assert ir.count("call void @llvm.amdgcn.sched.group.barrier(i32 8, i32 1, i32 0)") == 2
    asm = _asm(ir, target)
    loops = _loop_bodies(asm)
    assert any("s_setprio 1" in body and "s_setprio 0" in body and "s_barrier" in body
               and "v_mfma" in body for body in loops)
    # outside the loop: the offsetting barrier of group 1 and the re-aligning one of group 0
    assert asm.count("s_barrier") >= 4


def test_pingpong_on_hopper_keeps_barriers_and_drops_priorities():
    ir = compiler.llvm_ir(_hopper_pingpong, "sm_90a")
    mod = llvm.parse_assembly(ir)
    mod.verify()
    tm = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(cpu="sm_90a")
    ptx = tm.emit_assembly(mod)
    assert ptx.count("barrier.sync") >= 4 and "setprio" not in ptx


@pk.kernel(num_waves=8)
def _hopper_pingpong(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    t = pk.empty(pk.rt((4, 64), pk.f32))
    r0 = pk.wave_id() * 4
    with pk.pingpong() as pp:
        for k in pk.range(3):
            with pp.memory():
                pk.load(t, x, (r0, k * 64))
            with pp.compute():
                pk.store(out, pk.exp2(t), (r0, k * 64))


def test_pingpong_elementwise_runs_everywhere(rng):
    x = rng.standard_normal((32, 192)).astype(np.float32)
    for target in ("gfx942", "gfx950", "sm_90a"):
        out = pk.emulate(_hopper_pingpong, x, np.zeros_like(x), grid=1, target=target)["out"]
        np.testing.assert_allclose(out, np.exp2(x), rtol=1e-6)


def test_pingpong_needs_two_groups():
    @pk.kernel(num_waves=3)
    def odd(x: pk.gl[pk.f32, 2]):
        with pk.pingpong():
            pass

    with pytest.raises(pk.KernelError, match="even number of waves"):
        odd.specialize()


def test_unbalanced_manual_offset_is_a_deadlock(rng):
    @pk.kernel(num_waves=8)
    def unbalanced(x: pk.gl[pk.f32, 2]):
        with pk.if_(pk.wave_id() // 4 == 1):
            pk.barrier()              # offset without the re-aligning barrier after the loop
        for k in pk.range(2):
            pk.barrier()

    from pykittens.emulator import BarrierMismatch
    with pytest.raises(BarrierMismatch, match="deadlock"):
        pk.emulate(unbalanced, np.zeros((1, 1), np.float32) + 1, grid=1, target="gfx942")


def test_waitcnt_encoding_and_rendering():
    assert waitcnt_imm(vmcnt=0, lgkmcnt=0) == 0x0070
    assert waitcnt_imm() == 0xCF7F                 # nothing waited for
    assert waitcnt_imm(vmcnt=63) & 0xC00F == 0xC00F

    @pk.kernel
    def w(x: pk.gl[pk.f32, 2]):
        pk.waitcnt(vmcnt=0)
        pk.sched_barrier()

    ir = compiler.llvm_ir(w, "gfx942")
    assert "call void @llvm.amdgcn.sched.barrier(i32 0)" in ir
    assert "s_waitcnt vmcnt(0)" in _asm(ir, "gfx942")


def test_unknown_instruction_class():
    @pk.kernel
    def bad(x: pk.gl[pk.f32, 2]):
        pk.sched_group("tensor_core", 1)

    with pytest.raises(pk.KernelError, match="unknown instruction class 'tensor_core'"):
        bad.specialize()

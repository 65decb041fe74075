"""The oracle bites: realistic code-generation bugs planted in a code object or in the LLVM
IR, which the lane emulator cannot see (it runs the lane program), make the run from the
code object disagree with numpy, or stop at the race they cause; the unplanted code agrees.
(tools/mutations.py plants bugs in the compiler's source instead.)"""
import re
import struct

import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler, isa
from pykittens.ir import types as T
from pykittens.kernels import KERNELS
from pykittens.kernels.spec import rel_err
from pykittens.toolchain import amdgpu


def softmax_case(target):
    spec = KERNELS["softmax"]
    inputs = spec.make_inputs((16, 64), T.dtype_of("f32"), np.random.default_rng(3))
    grid, consts = spec.launch(inputs, target)
    return spec, inputs, grid, {**consts, "DT": "f32"}


def run_object(hsaco, kernel, target, inputs, grid, consts):
    prog = compiler.lane_ir(kernel, target, **consts)
    return isa.run(hsaco, target, prog.params, inputs, grid, prog.num_waves, kernel=prog.name)


def patch_word(hsaco: bytes, addr: int, word: int, fn) -> bytes:
    """The code object with 32-bit word `word` of the instruction at `addr` replaced by
    fn(old word)."""
    text = next(s for s in amdgpu.elf_sections(hsaco) if s.name == ".text")
    off = text.offset + addr - text.addr + 4 * word
    old = struct.unpack_from("<I", hsaco, off)[0]
    out = bytearray(hsaco)
    struct.pack_into("<I", out, off, fn(old))
    return bytes(out)


def first(hsaco, target, name, pattern):
    return next((a, t) for a, _, t in amdgpu.instructions(hsaco, target)[name] if pattern in t)


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("what", ["dpp", "swizzle"])
def test_wrong_cross_lane_pattern_in_the_code_object(target, what):
    """softmax's row reductions exchange lanes with DPP quad_perm:[1,0,3,2] (lane ^ 1) and
    ds_swizzle SWAP. Planted: the first DPP control becomes [2,3,0,1] (DPP_CTRL, bits
    [16:8] of the DPP word), or the first swizzle swaps 8 lanes instead of 4 (the DS
    offset, bits [15:0] of the first word)."""
    spec, inputs, grid, consts = softmax_case(target)
    obj = compiler.code_object(spec.kernel, target, **consts)
    ref = spec.reference(inputs)["out"]
    good = run_object(obj, spec.kernel, target, inputs, grid, consts)["out"]
    assert rel_err(good, ref) < 1e-5
    if what == "dpp":
        addr, text = first(obj, target, "softmax", "quad_perm:[1,0,3,2]")
        bad_obj = patch_word(obj, addr, 1, lambda w: (w & ~(0x1FF << 8)) | (0x4E << 8))
        want = "quad_perm:[2,3,0,1]"
    else:
        addr, text = first(obj, target, "softmax", "offset:swizzle(SWAP,4)")
        bad_obj = patch_word(obj, addr, 0, lambda w: (w & ~0xFFFF) | 0x1F | (8 << 10))
        want = "offset:swizzle(SWAP,8)"
    patched = dict((a, t) for a, _, t in amdgpu.instructions(bad_obj, target)["softmax"])[addr]
    assert want in patched and want not in text and patched.split()[0] == text.split()[0]
    bad = run_object(bad_obj, spec.kernel, target, inputs, grid, consts)["out"]
    assert rel_err(bad, ref) > 1e-2
    lane = pk.emulate(spec.kernel, grid=grid, target=target, **inputs, **consts)["out"]
    assert rel_err(lane, ref) < 1e-5           # the lane program never saw the bug


def mutate(ir: str, pattern: str, repl, count=1) -> str:
    new, n = re.subn(pattern, repl, ir, count=count, flags=re.M)
    assert n == count, f"pattern {pattern!r} not in the IR"
    return new


@pk.kernel(num_waves=4)
def reverse_blocks(x: pk.gl[pk.bf16, 2], out: pk.gl[pk.f32, 2]):
    """docs/language.md's shared-tile example: a 4-way swizzled LDS tile."""
    s = pk.empty(pk.st((32, 64), pk.bf16, swizzle=4))
    r0 = pk.program_id(0) * 32
    pk.load(s, x, (r0, 0))
    pk.barrier()
    w = pk.wave_id()
    t = pk.load(pk.rt((8, 64), pk.f32), s, (w * 8, 0))
    pk.store(out, t, (r0 + (3 - w) * 8, 0))


@pk.kernel(num_waves=1)
def to_int(x: pk.gl[pk.f32, 2], out: pk.gl[pk.i32, 2]):
    pk.store(out, pk.cast(pk.load(pk.rt((4, 64), pk.f32), x, (0, 0)), pk.i32), (0, 0))


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_wrong_lds_swizzle_mask_in_the_ir(target):
    """Planted: the first XOR mask of the shared tile's swizzle (row & 3, the LDS writes)
    becomes row & 1, so writes and reads disagree about where a chunk sits."""
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(pk.bf16.np)
    want = x.astype(np.float32).reshape(4, 8, 64)[::-1].reshape(32, 64)
    ir = compiler.llvm_ir(reverse_blocks, target)
    sw = re.findall(r"^\s*(%\w+) = and i32 (%\w+), 3(?:, !dbg !\d+)?$", ir, re.M)
    assert sw, "no swizzle mask in the IR"
    bad_ir = mutate(ir, rf"^(\s*{sw[0][0]} = and i32 {sw[0][1]}), 3\b", r"\1, 1")
    args = {"x": x, "out": np.zeros((32, 64), np.float32)}
    good = run_object(amdgpu.compile_ir(ir, target), reverse_blocks, target, args, (1,), {})
    assert np.array_equal(good["out"], want)
    bad = run_object(amdgpu.compile_ir(bad_ir, target), reverse_blocks, target, args, (1,), {})
    assert not np.array_equal(bad["out"], want)


def test_truncating_float_to_int_cast_in_the_ir():
    """pk.cast(f32 -> i32) rounds to nearest even (llvm.rint, then a saturating convert).
    Planted: the rounding dropped, so the conversion truncates toward zero."""
    target = "gfx950"
    x = np.tile(np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.7, -2.7, 1e10], np.float32), (4, 8))
    x64 = x.astype(np.float64)
    want = np.clip(np.rint(x64), -2**31, 2**31 - 1).astype(np.int32)
    ir = compiler.llvm_ir(to_int, target)
    rint = re.search(r"(%\w+) = call <(\d+) x float> @llvm\.rint\.v\d+f32\(<\d+ x float> "
                     r"(%\w+)\)", ir)
    bad_ir = mutate(ir, rf"(@llvm\.fptosi\.sat\.[\w.]+\(<\d+ x float> ){rint.group(1)}\)",
                    rf"\g<1>{rint.group(3)})")
    args = {"x": x, "out": np.zeros((4, 64), np.int32)}
    good = run_object(amdgpu.compile_ir(ir, target), to_int, target, args, (1,), {})
    assert np.array_equal(good["out"], want)
    bad = run_object(amdgpu.compile_ir(bad_ir, target), to_int, target, args, (1,), {})
    assert np.array_equal(bad["out"], np.trunc(x64).clip(-2**31, 2**31 - 1).astype(np.int32))
    assert not np.array_equal(bad["out"], want)


@pk.kernel(num_waves=4)
def swap_blocks(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2]):
    """Wave w puts rows 8w..8w+7 into LDS and, after the barrier, reads wave 3 - w's."""
    s = pk.empty(pk.st((32, 64), pk.f32))
    w = pk.wave_id()
    pk.store(s, pk.load(pk.rt((8, 64), pk.f32), x, (w * 8, 0)), (w * 8, 0))
    pk.barrier()
    pk.store(out, pk.load(pk.rt((8, 64), pk.f32), s, ((3 - w) * 8, 0)), (w * 8, 0))


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_barrier_without_its_fences_in_the_ir(target):
    """pk.barrier() is s_barrier between workgroup release and acquire fences, for which
    LLVM first waits for the wave's LDS writes (s_waitcnt lgkmcnt(0)): the LDS requests of
    different waves may be reordered (AMDGPUUsage, memory model GFX942). Planted: the fences
    dropped, so the writes are still in flight at the barrier when another wave reads
    them; the lane program, which has no such thing as a request in flight, is right."""
    x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    want = x.reshape(4, 8, 64)[::-1].reshape(32, 64)
    ir = compiler.llvm_ir(swap_blocks, target)
    bad_ir = mutate(ir, r'^\s*fence syncscope\("workgroup"\) (?:release|acquire)(?:, !dbg !\d+)?\n',
                    "", count=2)
    args = {"x": x, "out": np.zeros((32, 64), np.float32)}
    good = run_object(amdgpu.compile_ir(ir, target), swap_blocks, target, args, (1,), {})
    assert np.array_equal(good["out"], want)
    with pytest.raises(isa.ISAError, match=r"reads LDS bytes \d+\.\.\d+ while wave \d's "
                                           r"ds_write_b\d+ at 0x[0-9a-f]+ may still be writing"):
        run_object(amdgpu.compile_ir(bad_ir, target), swap_blocks, target, args, (1,), {})
    lane = pk.emulate(swap_blocks, x, np.zeros((32, 64), np.float32), grid=1, target=target)
    assert np.array_equal(lane["out"], want)

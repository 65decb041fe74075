"""Wait-state rules (pykittens/isa/hazards.py): each rule fires one wait state short of its
requirement and not at it, when the emulator runs the instructions (dynamic) and over a
listing (static, across branches); LLVM-generated library code has no violation, nor do the
pinned-register MFMAs (inline asm, invisible to LLVM's hazard recognizer), whose wait states
the renderer places: without them the checks report the read that comes too early."""
import numpy as np
import pytest

import pykittens as pk
from pykittens import compiler, isa
from pykittens.isa import ISAError
from pykittens.kernels import KERNELS
from isa_helpers import execute

MFMA32 = {"gfx942": "v_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[2:3], a[0:15]",
          "gfx950": "v_mfma_f32_32x32x16_bf16 a[0:15], v[0:3], v[4:7], a[0:15]"}
MFMA16 = {"gfx942": "v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]",
          "gfx950": "v_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[4:7], a[0:3]"}


def listing(lines) -> str:
    """A disassembly-style listing: `name:`, then one instruction a line with `// addr`."""
    return "k:\n" + "".join(f"\t{t} // {4 * i:x}\n" for i, t in enumerate(lines))


def nops(n: int) -> list[str]:
    """Exactly n wait states of s_nop (s_nop k gives k + 1)."""
    out = []
    while n > 0:
        k = min(n, 8)
        out.append(f"s_nop {k - 1}")
        n -= k
    return out


def check(producer, consumer, need, rule, target="gfx950", setup=(), lds=None):
    """consumer one wait state early is a violation (static and dynamic), on time is not."""
    early = [*setup, *producer, *nops(need - 1), *consumer]
    on_time = [*setup, *producer, *nops(need), *consumer]
    found = isa.check_hazards(listing(early), target)
    assert [v.rule for v in found] == [rule], found
    assert found[0].needed == need and found[0].actual == need - 1
    assert isa.check_hazards(listing(on_time), target) == []
    with pytest.raises(ISAError, match=rf"needs {need} \({rule}\)"):
        execute(early, target, lds=lds, check_waits=False)
    execute(on_time, target, lds=lds, check_waits=False)


@pytest.mark.parametrize("target,mfma,need", [
    ("gfx942", MFMA32, 11), ("gfx950", MFMA32, 12),      # 8 passes: + 3, gfx950 + 1
    ("gfx942", MFMA16, 7), ("gfx950", MFMA16, 8)])       # 4 passes
def test_mfma_result_read_by_valu(target, mfma, need):
    check([mfma[target]], ["v_accvgpr_read_b32 v8, a1"], need, "xdl-write-read", target)


@pytest.mark.parametrize("target,need", [("gfx942", 7), ("gfx950", 8)])
def test_mfma_result_as_another_mfmas_a_operand(target, need):
    d = "v[8:11]"
    prod = MFMA16[target].replace("a[0:3],", f"{d},", 1)
    a = "v[8:9]" if target == "gfx942" else "v[8:11]"
    cons = MFMA16[target].replace("v[0:1]," if target == "gfx942" else "v[0:3],", f"{a},", 1)
    check([prod], [cons], need, "xdl-write-srcab", target)


@pytest.mark.parametrize("target,need", [("gfx942", 5), ("gfx950", 6)])
def test_mfma_overlapping_srcc(target, need):
    """D a[0:3] feeding SrcC a[2:5] (overlapping, not the same range): passes + 1
    (+ 1 on gfx950); the same range back to back needs nothing."""
    cons = MFMA16[target].replace("a[0:3], v", "a[2:5], v", 1).replace(", a[0:3]", ", a[2:5]")
    check([MFMA16[target]], [cons], need, "xdl-write-srcc", target)
    assert isa.check_hazards(listing([MFMA16[target], MFMA16[target]]), target) == []


def test_srcc_read_then_overwritten():
    check(["v_mfma_f32_32x32x16_bf16 a[16:31], v[0:3], v[4:7], a[0:15]"],
          ["v_accvgpr_write_b32 a3, v9"], 7, "srcc-war")


def test_mfma_result_overwritten_by_valu():
    check([MFMA16["gfx942"]], ["v_accvgpr_write_b32 a2, v9"], 7, "xdl-write-waw", "gfx942")


@pytest.mark.parametrize("producer,consumer,need,rule", [
    (["v_mov_b32_e32 v5, 1"], ["v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0"], 2,
     "valu-write-mfma"),
    (["v_accvgpr_write_b32 a2, 0"], ["v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], a[0:3]"],
     2, "valu-write-mfma"),
    (["v_cmpx_lt_u32_e64 s[2:3], v1, 70"], ["v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0"],
     4, "valu-exec-mfma"),
    (["v_add_f32_e32 v1, v2, v3"], ["v_mov_b32_dpp v4, v1 quad_perm:[1,0,3,2] row_mask:0xf "
                                    "bank_mask:0xf"], 2, "valu-vgpr-dpp"),
    (["v_cmpx_lt_u32_e64 s[2:3], v1, 70"], ["v_mov_b32_dpp v4, v5 quad_perm:[1,0,3,2] "
                                            "row_mask:0xf bank_mask:0xf"], 5, "valu-exec-dpp"),
    (["v_readfirstlane_b32 s4, v1"], ["v_readlane_b32 s5, v2, s4"], 4, "valu-sgpr-lanesel"),
    (["v_cmp_lt_f32_e32 vcc, v1, v2"], ["v_div_fmas_f32 v3, v4, v5, v6"], 4, "valu-vcc-divfmas"),
    (["v_cmp_lt_f32_e64 s[6:7], v1, v2"], ["v_cndmask_b32_e64 v3, v4, v5, s[6:7]"], 2,
     "valu-sgpr-valu"),
    (["v_exp_f32_e32 v1, v2"], ["v_add_f32_e32 v3, v1, v1"], 1, "trans-forward"),
    (["v_add_u32_e32 v1, v2, v3"], ["v_readfirstlane_b32 s4, v1"], 1, "valu-vgpr-readlane"),
    (["v_cmpx_lt_u32_e64 s[2:3], v1, 70"], ["v_readfirstlane_b32 s4, v5"], 4,
     "valu-exec-rwlane"),
])
def test_valu_rules(producer, consumer, need, rule):
    check(producer, consumer, need, rule)


def test_lds_dma_after_m0_write():
    from pykittens.isa.state import Memory
    mem = Memory()
    base = mem.alloc(256, "buf")
    setup = [f"s_mov_b32 s4, {base & 0xFFFFFFFF}", f"s_mov_b32 s5, {base >> 32}",
             "s_mov_b32 s6, 256", "s_mov_b32 s7, 0x20000", "s_nop 4"]
    prog = setup + ["s_mov_b32 m0, 0", "buffer_load_dword v0, s[4:7], 0 offen lds",
                    "s_waitcnt vmcnt(0)"]
    found = isa.check_hazards(listing(prog), "gfx942")
    assert [v.rule for v in found] == ["salu-m0-ldsdma"]
    with pytest.raises(ISAError, match="salu-m0-ldsdma"):
        execute(prog, "gfx942", v={0: np.arange(64) * 4}, mem=mem, lds=np.zeros(256, np.uint8))


def test_wide_store_data_overwritten():
    found = isa.check_hazards(listing(["buffer_store_dwordx4 v[0:3], v4, s[8:11], 0 offen",
                                       "v_mov_b32_e32 v2, 0"]), "gfx942")
    assert [(v.rule, v.needed, v.access) for v in found] == [("store-data-war", 2, "writes")]


def test_static_check_follows_back_edges():
    """Straight-line, the read at the top of the loop is far from the MFMA at its bottom;
    around the back edge it comes 1 wait state after it."""
    asm = ("k:\n.L0:\n"
           "\tv_accvgpr_read_b32 v8, a0 // 0\n"
           "\ts_nop 7 // 8\n\ts_nop 7 // c\n"
           f"\t{MFMA32['gfx950']} // 10\n"
           "\ts_cbranch_scc1 .L0 // 18\n"
           "\ts_endpgm // 1c\n")
    found = isa.check_hazards(asm, "gfx950")
    assert len(found) == 1
    v = found[0]
    assert (v.producer, v.consumer, v.register, v.actual, v.needed) == (
        "v_mfma_f32_32x32x16_bf16 at 0x10", "v_accvgpr_read_b32 at 0x0", "a0", 1, 12)
    assert str(v) == ("[k] wait-state hazard: v_accvgpr_read_b32 at 0x0 reads a0 1 wait "
                      "state(s) after v_mfma_f32_32x32x16_bf16 at 0x10; needs 12 "
                      "(xdl-write-read)")


def test_rules_table_cites_its_sources():
    from pykittens.isa.hazards import RULES
    names = {r.name for r in RULES}
    assert {"xdl-write-read", "xdl-write-srcc", "valu-write-mfma", "srcc-war"} <= names
    assert all(r.source for r in RULES)


# ---- real code objects -------------------------------------------------------------------------

@pytest.mark.parametrize("name,target", [(n, t) for n in sorted(KERNELS) for t in
                                         ("gfx942", "gfx950") if t in KERNELS[n].targets])
def test_library_code_has_no_hazards(name, target):
    """LLVM places the wait states of the code it generates: no rule fires on any path."""
    spec = KERNELS[name]
    asm = compiler.assembly(spec.kernel, target, **spec.compile_consts)
    assert isa.check_hazards(asm, target) == []


@pk.kernel(num_waves=1)
def pinned_step(a: pk.gl[pk.bf16, (32, 32)], bt: pk.gl[pk.bf16, (32, 32)],
                c: pk.gl[pk.f32, (32, 32)]):
    """One K step of docs/examples/pinned_gemm.py: no loop between the MFMAs and the
    store, so the accumulator is read right after the last MFMA."""
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    ta = pk.load(pk.rt((32, 32), pk.bf16, role="a", pin="v200"), a, (0, 0))
    tb = pk.load(pk.rt((32, 32), pk.bf16, role="b", layout="row", pin="v216"), bt, (0, 0))
    pk.mma_ABt(acc, ta, tb)
    pk.store(c, acc)


@pytest.mark.parametrize("target,mfma,need", [("gfx942", "v_mfma_f32_32x32x8_bf16", 11),
                                              ("gfx950", "v_mfma_f32_32x32x16_bf16", 12)])
def test_pinned_mfma_accumulator_read_waits(target, mfma, need):
    """Pinned MFMAs are inline asm, which LLVM's hazard recognizer does not see: the
    renderer puts the wait states before the first v_accvgpr_read of the accumulator, so
    neither check finds a hazard, and the code object runs. Without the renderer's s_nops
    the read follows the last MFMA at once, and the static check names both
    instructions."""
    asm = compiler.assembly(pinned_step, target)
    assert isa.check_hazards(asm, target) == []
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 32)).astype(pk.bf16.np)
    c = pk.emulate(pinned_step, a, a, np.zeros((32, 32), np.float32), grid=1, target=target,
                   isa=True)["c"]
    assert np.allclose(c, a.astype(np.float64) @ a.astype(np.float64).T, rtol=1e-5, atol=1e-4)
    bare = "\n".join(ln for ln in asm.split("\n") if not ln.strip().startswith("s_nop"))
    found = isa.check_hazards(bare, target)
    reads = [v for v in found if v.rule == "xdl-write-read"]
    assert reads and {v.rule for v in found} <= {"xdl-write-read", "valu-write-mfma"}
    first = min(reads, key=lambda v: v.actual)
    assert first.producer.startswith(mfma) and first.consumer.startswith("v_accvgpr_read_b32")
    assert (first.actual, first.needed) == (0, need)
"""Wait states around MFMAs in real CDNA code objects, checked by a scanner written here from
the documented rules (not from the renderer's tables).

LLVM's hazard recognizer does not look into inline asm, so the pinned-register kernels
(whose MFMAs, accumulator reads and operand writes are inline asm) rely on the s_nops the
renderer puts there. The rules, from AMD's Instinct MI300 (CDNA3) ISA guide, section 7.6
"Dependency Resolution: Required Independent Instructions" (XDL rows) and the CDNA4 ISA's
same table, as LLVM's GCNHazardRecognizer transcribes them:

- an MFMA of P passes writes a register; a VALU / VMEM / DS instruction then reads it, a
  VALU overwrites it, or an MFMA reads it as A or B: P + 3 wait states in between on gfx942,
  P + 4 on gfx950 (P > 2);
- ... an MFMA reads an overlapping but different range as C: P + 1 / P + 2 (the same range:
  none, the hardware chains dependent MFMAs);
- a VALU instruction (v_mov, v_accvgpr_write, ...) writes a register an MFMA then reads: 2;
- an MFMA reads a register as C, a VALU then overwrites it: P - 1;
- a VALU writes EXEC, an MFMA follows: 4.

A wait state is one issued instruction; `s_nop N` is N + 1. Passes per MFMA: the AMD Matrix
Instruction Calculator's execution cycles / 4 (CDNA3: 32x32x8 and 32x32x16 32 cycles, 16x16
16) and the CDNA4 ISA (32x32x16 and 16x16x32 as CDNA3; f8f6f4 with fp8 data 64 and 32)."""
import re

import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels.gemm_cdna import gemm_pingpong
from pykittens import compiler
from pykittens.analysis import hsaco
from pykittens.toolchain import amdgpu
from conftest import ROOT

CDNA = ("gfx942", "gfx950")
CYCLES = {"32x32x8": 32, "16x16x16": 16, "32x32x16": 32, "16x16x32": 16,
          "32x32x64": 64, "16x16x128": 32}
REG = re.compile(r"(?<![\w])([va])(?:\[(\d+):(\d+)\]|(\d+))(?![\w])")


def passes(mnemonic: str) -> int:
    return CYCLES[re.search(r"_(\d+x\d+x\d+)", mnemonic).group(1)] // 4


def after_mfma_write(p: int, target: str) -> int:
    return p + 3 + (target == "gfx950" and p > 2)


def regs(text: str) -> list[tuple[str, int]]:
    out = []
    for f, lo, hi, one in REG.findall(text):
        lo, hi = (int(lo), int(hi)) if lo else (int(one), int(one))
        out += [(f, r) for r in range(lo, hi + 1)]
    return out


def operands(arg: str) -> list[str]:
    """Comma-separated operands, modifiers (op_sel, cbsz, blgp, offset, ...) dropped."""
    head = re.split(r" (?:op_sel|cbsz|blgp)", arg)[0]
    return [o.strip() for o in re.split(r",(?![^\[]*\])", head)]


class Inst:
    """One instruction: its kind, vector registers written and read, and for MFMAs the
    C range and passes."""

    def __init__(self, op: str, arg: str):
        self.op, self.arg = op, arg
        ops = operands(arg) if arg else []
        self.wait = int(arg) + 1 if op == "s_nop" else 1
        self.kind = ("mfma" if op.startswith("v_mfma") else "valu" if op.startswith("v_") else
                     "mem" if op.startswith(("buffer_", "global_", "flat_", "scratch_", "ds_"))
                     else "other")
        self.defs, self.uses, self.src_c, self.passes = set(), set(), None, 0
        if self.kind == "mfma":
            self.defs = set(regs(ops[0]))
            self.src_ab = set(regs(ops[1])) | set(regs(ops[2]))
            self.src_c = frozenset(regs(ops[3]))
            self.uses = self.src_ab | self.src_c | set(regs(",".join(ops[4:])))
            self.passes = passes(op)
        elif self.kind == "valu":
            first = regs(ops[0]) if ops else []
            self.defs = set(first)
            self.uses = set(regs(",".join(ops[1:])))
        elif self.kind == "mem":
            loads = "load" in op or op.startswith(("ds_read", "ds_bpermute", "ds_swizzle"))
            self.defs = set(regs(ops[0])) if loads and "lds" not in arg.split() else set()
            self.uses = set(regs(",".join(ops[1:] if self.defs else ops)))
        self.writes_exec = self.kind == "valu" and op.startswith("v_cmpx")


def need(prod: Inst, cons: Inst, reg, target: str) -> int:
    """Wait states the documented rules require between producer and consumer through
    register `reg` (None: an EXEC write), 0 where none apply."""
    if reg is None:
        return 4 if prod.writes_exec and cons.kind == "mfma" else 0
    if prod.kind == "mfma" and reg in prod.defs:
        if cons.kind == "mfma" and reg in cons.src_c and reg not in cons.src_ab:
            if cons.src_c == frozenset(prod.defs):
                return 0
            return prod.passes + 1 + (target == "gfx950")
        if cons.kind in ("mfma", "valu", "mem"):
            return after_mfma_write(prod.passes, target)
    if prod.kind == "valu" and reg in prod.defs and cons.kind == "mfma" and reg in cons.uses:
        return 2
    if prod.kind == "mfma" and reg in prod.src_c and cons.kind == "valu" and reg in cons.defs:
        return prod.passes - 1
    return 0


def scan(insts: list[Inst], blocks, succs, target: str) -> list[str]:
    """Every (producer, consumer) pair closer than the rules allow on some path of the
    control-flow graph: walk back from each instruction through all predecessors until 20
    wait states or until the register's nearest writer."""
    block_of = {i: b for b, rng in enumerate(blocks) for i in rng}
    preds = {b: [p for p, ss in enumerate(succs) if b in ss] for b in range(len(blocks))}
    bad = []
    for ci, cons in enumerate(insts):
        if cons.kind not in ("mfma", "valu", "mem"):
            continue
        for reg in sorted(cons.uses | cons.defs) + [None]:
            stack, seen = [(ci, 0)], set()
            while stack:
                i, gap = stack.pop()
                b = block_of[i]
                prev = [i - 1] if i > blocks[b].start else [blocks[p][-1] for p in preds[b]]
                for j in prev:
                    if (j, gap) in seen:
                        continue
                    seen.add((j, gap))
                    prod = insts[j]
                    req = need(prod, cons, reg, target)
                    if req > gap:
                        bad.append(f"{prod.op} {prod.arg} -> {cons.op} {cons.arg}: "
                                   f"{gap} wait states, {req} needed")
                    last_write = reg is not None and reg in prod.defs or \
                        reg is None and prod.writes_exec
                    if not last_write and gap + prod.wait < 20:
                        stack.append((j, gap + prod.wait))
    return sorted(set(bad))


def disassembly(kernel, target, **consts):
    obj = compiler.code_object(kernel, target, **consts)
    name = compiler.lane_ir(kernel, target, **consts).name
    text, labels = hsaco.instructions(amdgpu.disassemble(obj, target), name)
    return [Inst(op, arg) for op, arg in text], text, labels


def violations(kernel, target, drop_nops=False, **consts):
    insts, text, labels = disassembly(kernel, target, **consts)
    if drop_nops:                       # the mutation: what the scanner sees without s_nops
        keep = [i for i, (op, _) in enumerate(text) if op != "s_nop"]
        new = {old: n for n, old in enumerate(keep)}
        labels = {k: min(n for o, n in new.items() if o >= v) for k, v in labels.items()}
        text, insts = [text[i] for i in keep], [insts[i] for i in keep]
    blocks, succs = hsaco.basic_blocks(text, labels)
    return scan(insts, blocks, succs, target)


# ---- the kernels: every pinned form the renderer emits ----------------------------------------

import runpy  # noqa: E402

doc_pinned_gemm = runpy.run_path(f"{ROOT}/docs/examples/pinned_gemm.py")["pinned_gemm"]
from test_cdna_static import pinned_gemm as static_pinned_gemm  # noqa: E402


@pk.kernel(num_waves=1)
def pinned_fp8(a: pk.gl["DT", 2], bt: pk.gl["DT", 2], c: pk.gl[pk.f32, 2],
               DT: pk.const = "e4m3", BK: pk.const = 64, MMA: pk.const = 32):
    """fp8 operands, 16x16 or 32x32 MFMAs, the accumulator re-zeroed and stored every K step
    (acc read right after an MFMA, acc writes right after an MFMA read it)."""
    acc = pk.zeros(pk.rt((MMA, MMA), pk.f32, role="acc", mma=MMA, pin="a0"))
    ta = pk.empty(pk.rt((MMA, BK), DT, role="a", mma=MMA, pin="v192"))
    tb = pk.empty(pk.rt((MMA, BK), DT, role="b", layout="row", mma=MMA, pin="v224"))
    for k in pk.range(a.shape[1] // BK):
        pk.load(ta, a, (0, k * BK))
        pk.load(tb, bt, (0, k * BK))
        pk.mma_ABt(acc, ta, tb)
        pk.store(c, acc, (k * MMA, 0))
        pk.fill(acc, 0.0)


@pk.kernel(num_waves=1)
def pinned_fp8_step(a: pk.gl[pk.e4m3, 2], bt: pk.gl[pk.e4m3, 2], c: pk.gl[pk.f32, 2]):
    """One fp8 MFMA in straight-line code: the loads' last writes to its pinned operands
    come right before it."""
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    ta = pk.load(pk.rt((32, 64), pk.e4m3, role="a", pin="v192"), a, (0, 0))
    tb = pk.load(pk.rt((32, 64), pk.e4m3, role="b", layout="row", pin="v224"), bt, (0, 0))
    pk.mma_ABt(acc, ta, tb)
    pk.store(c, acc)


@pk.kernel(num_waves=1)
def pinned_mx(a: pk.gl[pk.e4m3, 2], b: pk.gl[pk.e4m3, 2], sa: pk.gl[pk.e8m0, 2],
              sb: pk.gl[pk.e8m0, 2], c: pk.gl[pk.f32, 2]):
    """Block-scaled MFMAs on a pinned accumulator: the scales are asm inputs."""
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    for k in pk.range(a.shape[1] // 64):
        ta = pk.load(pk.rt((32, 64), pk.e4m3, role="a", scaled=True), a, (0, k * 64))
        tb = pk.load(pk.rt((64, 32), pk.e4m3, "col", role="b", scaled=True), b, (k * 64, 0))
        s_a = pk.load(pk.rt((32, 2), pk.e8m0, role="a_scale"), sa, (0, k * 2))
        s_b = pk.load(pk.rt((2, 32), pk.e8m0, role="b_scale"), sb, (k * 2, 0))
        pk.mma_AB(acc, ta, tb, scale_a=s_a, scale_b=s_b)
    pk.store(c, acc)


@pk.kernel(num_waves=1)
def pinned_operands(a: pk.gl[pk.bf16, 2], bt: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2]):
    """Pinned operands, an accumulator LLVM allocates: the MFMA is LLVM's intrinsic, which
    reads registers that inline asm wrote, then its result goes to a pinned tile."""
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc"))
    ta = pk.empty(pk.rt((32, 32), pk.bf16, role="a", pin="v200"))
    tb = pk.empty(pk.rt((32, 32), pk.bf16, role="b", layout="row", pin="v216"))
    for k in pk.range(a.shape[1] // 32):
        pk.load(ta, a, (0, k * 32))
        pk.load(tb, bt, (0, k * 32))
        pk.mma_ABt(acc, ta, tb)
    out = pk.empty(pk.rt((32, 32), pk.f32, role="acc", pin="a64"))
    pk.copy(out, acc)
    pk.store(c, out)


@pk.kernel(num_waves=1)
def pinned_branch(a: pk.gl[pk.bf16, 2], bt: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
                  d: pk.gl[pk.f32, 2]):
    """Pinned asm on one side of a branch only: the instructions it issues are no distance
    on the other path, so the accumulator read after the join must still wait."""
    acc = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a0"))
    other = pk.zeros(pk.rt((32, 32), pk.f32, role="acc", pin="a16"))
    ta = pk.empty(pk.rt((32, 32), pk.bf16, role="a", pin="v200"))
    tb = pk.empty(pk.rt((32, 32), pk.bf16, role="b", layout="row", pin="v216"))
    pk.load(ta, a, (0, 0))
    pk.load(tb, bt, (0, 0))
    pk.mma_ABt(acc, ta, tb)
    with pk.if_(a.shape[1] > 32):
        pk.fill(other, 1.0)
    pk.store(c, acc)
    pk.store(d, other)


KERNELS = {
    "doc_pinned_gemm": (doc_pinned_gemm, {}, CDNA),
    "static_pinned_gemm": (static_pinned_gemm, {}, CDNA),
    "pinned_fp8_32": (pinned_fp8, {}, ("gfx950",)),
    "pinned_fp8_16": (pinned_fp8, {"MMA": 16, "BK": 128}, ("gfx950",)),
    "pinned_fp8_short_k": (pinned_fp8, {"BK": 32}, ("gfx950",)),
    "pinned_fp8_step": (pinned_fp8_step, {}, ("gfx950",)),
    "pinned_fnuz": (pinned_fp8, {"DT": "e4m3fnuz", "BK": 32}, ("gfx942",)),
    "pinned_mx": (pinned_mx, {}, ("gfx950",)),
    "pinned_operands": (pinned_operands, {}, CDNA),
    "pinned_branch": (pinned_branch, {}, CDNA),
    "gemm_pingpong": (gemm_pingpong, {"DT": "bf16", "OUT": "f32"}, CDNA),   # the library's
}
CASES = [(name, t) for name, (_, _, ts) in KERNELS.items() for t in ts]


@pytest.mark.parametrize("name,target", CASES)
def test_pinned_kernels_leave_the_documented_wait_states(name, target):
    kernel, consts, _ = KERNELS[name]
    assert violations(kernel, target, **consts) == []


@pytest.mark.parametrize("target,consts", [("gfx942", {"DT": "bf16"}), ("gfx950", {"DT": "bf16"}),
                                           ("gfx950", {"DT": "e4m3", "MMA": 16, "BK": 128}),
                                           ("gfx950", {"DT": "e5m2", "MMA": 32, "BK": 64})])
def test_llvm_meets_the_same_rules_around_its_own_mfmas(target, consts):
    """Cross-check of the scanner: the MFMAs LLVM generates (no pins, its hazard recognizer
    places the wait states) pass the rules as written here."""
    from test_mma import gemm
    assert violations(gemm, target, **consts) == []


@pytest.mark.parametrize("name,target,consumer", [
    ("pinned_fp8_32", "gfx950", "-> v_accvgpr_read_b32"),      # acc read after its MFMA
    ("pinned_fnuz", "gfx942", "-> v_accvgpr_read_b32"),
    ("pinned_fp8_step", "gfx950", "-> v_mfma_f32_32x32x64_f8f6f4"),  # operand write, MFMA
    ("pinned_mx", "gfx950", "-> v_mfma_scale_f32_32x32x64_f8f6f4"),  # LLVM's VALU, asm MFMA
    ("pinned_operands", "gfx942", "-> v_mfma_f32_32x32x8_bf16")])   # asm read, LLVM's MFMA
def test_the_scanner_finds_the_hazards_without_the_nops(name, target, consumer):
    """Mutation check: the same code objects without their s_nops break the rules, so the
    scan above is not vacuous."""
    kernel, consts, _ = KERNELS[name]
    bad = violations(kernel, target, drop_nops=True, **consts)
    assert any(consumer in b for b in bad), bad


def nops_before(text, index) -> int:
    n, i = 0, index - 1
    while i >= 0 and text[i][0] == "s_nop":
        n += int(text[i][1]) + 1
        i -= 1
    return n


@pytest.mark.parametrize("kernel,consts", [(doc_pinned_gemm, {}),
                                           (static_pinned_gemm, {})])
def test_accumulator_read_waits_one_more_on_gfx950(kernel, consts):
    """The first read of the accumulator after the K loop waits for the last MFMA (8 passes):
    11 wait states on gfx942, 12 on gfx950 (nothing else of ours runs in between, so the
    renderer puts all of them in front of the read)."""
    got = {}
    for target in CDNA:
        insts, text, _ = disassembly(kernel, target, **consts)
        first = next(i for i, (op, arg) in enumerate(text) if op == "v_accvgpr_read_b32"
                     and i > max(j for j, x in enumerate(insts) if x.kind == "mfma"))
        last_mfma = [x for x in insts if x.kind == "mfma"][-1]
        got[target] = nops_before(text, first)
        assert got[target] == after_mfma_write(last_mfma.passes, target)
    assert got == {"gfx942": 11, "gfx950": 12}


@pytest.mark.parametrize("target", CDNA)
def test_back_to_back_pinned_mfmas_wait_for_their_operand_writes(target):
    """Consecutive MFMAs on the same accumulator need nothing between them, but each reads
    operand registers the loop's v_movs wrote shortly before: 2 wait states from the last
    such write, made up by the renderer's s_nops where LLVM put nothing of its own."""
    insts, text, _ = disassembly(doc_pinned_gemm, target)
    mfma = [i for i, x in enumerate(insts) if x.kind == "mfma"]
    assert len(mfma) == {"gfx942": 4, "gfx950": 2}[target]
    for j in mfma:
        last = max(i for i in range(mfma[0]) if insts[i].defs & insts[j].src_ab)
        assert sum(insts[k].wait for k in range(last + 1, j)) >= 2


def test_fp8_pinned_mfma_is_the_f8f6f4_instruction():
    _, text, _ = disassembly(pinned_fp8, "gfx950")
    mnemonics = {op for op, _ in text if op.startswith("v_mfma")}
    assert mnemonics == {"v_mfma_f32_32x32x64_f8f6f4"}
    _, text, _ = disassembly(pinned_fp8, "gfx950", DT="e5m2", MMA=16, BK=128)
    assert [arg for op, arg in text if op.startswith("v_mfma")] == \
        ["a[0:3], v[192:199], v[224:231], a[0:3] cbsz:1 blgp:1"]


def test_pinned_mx_passes_its_scales():
    _, text, _ = disassembly(pinned_mx, "gfx950")
    (arg,) = [arg for op, arg in text if op == "v_mfma_scale_f32_32x32x64_f8f6f4"]
    assert re.fullmatch(r"a\[0:15\], v\[\d+:\d+\], v\[\d+:\d+\], a\[0:15\], v\d+, v\d+ "
                        r"op_sel_hi:\[0,0,0\]", arg), arg


@pytest.mark.parametrize("name,target", [("pinned_fp8_32", "gfx950"), ("pinned_mx", "gfx950"),
                                         ("pinned_operands", "gfx942")])
def test_pinned_variants_compute_the_product(name, target, rng):
    """The forms above are also right, in the lane emulator (float64 reference)."""
    kernel, consts, _ = KERNELS[name]
    if name == "pinned_fp8_32":
        a = rng.standard_normal((32, 128)).astype(pk.e4m3.np)
        b = rng.standard_normal((32, 128)).astype(pk.e4m3.np)
        out = pk.emulate(kernel, a, b, np.zeros((64, 32), np.float32), grid=1,
                         target=target, **consts)["c"]
        ref = np.concatenate([a[:, k:k + 64].astype(np.float64) @
                              b[:, k:k + 64].astype(np.float64).T for k in (0, 64)])
    elif name == "pinned_mx":
        a = rng.standard_normal((32, 128)).astype(pk.e4m3.np)
        b = rng.standard_normal((128, 32)).astype(pk.e4m3.np)
        sa = (2.0 ** rng.integers(-3, 4, (32, 4))).astype(pk.e8m0.np)
        sb = (2.0 ** rng.integers(-3, 4, (4, 32))).astype(pk.e8m0.np)
        out = pk.emulate(kernel, a, b, sa, sb, np.zeros((32, 32), np.float32), grid=1,
                         target=target)["c"]
        ref = (a.astype(np.float64) * np.repeat(sa.astype(np.float64), 32, 1)) @ \
            (b.astype(np.float64) * np.repeat(sb.astype(np.float64), 32, 0))
    else:
        a = rng.standard_normal((32, 64)).astype(pk.bf16.np)
        b = rng.standard_normal((32, 64)).astype(pk.bf16.np)
        out = pk.emulate(kernel, a, b, np.zeros((32, 32), np.float32), grid=1,
                         target=target)["c"]
        ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.linalg.norm(out - ref) <= 1e-5 * np.linalg.norm(ref)

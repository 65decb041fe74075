"""What tile-level communication compiles to: a peer view (`x.peer(r)`, r known at run time)
is a chain of selects over the ranks' pointers, and pk.signal / pk.wait_flag become a
release by lane 0 and an acquire spin loop at system scope, with the fences and cache
maintenance each chip needs (sm_90a PTX; gfx942 and gfx950 code objects)."""
import re

import pytest

import pykittens as pk
from pykittens import compiler
from pykittens.analysis import hsaco
from pykittens.runtime.args import written_params
from pykittens.toolchain import amdgpu

pytestmark = pytest.mark.usefixtures("module_cache")

TARGETS = ("sm_90a", "gfx942", "gfx950")
CDNA = ("gfx942", "gfx950")
WORLD = 3


@pk.kernel(num_waves=2)
def exchange(x: pk.gl[pk.f32, 2], out: pk.gl[pk.f32, 2], y: pk.peers[pk.f32, 2, "W"],
             flags: pk.peers[pk.i32, 2, "W"], epoch: pk.i32, W: pk.const = None):
    """Push this rank's rows to the next rank, publish them, count arrivals, wait for the
    previous rank's, read them back from it."""
    me = y.rank
    row = pk.wave_id() * 16
    nxt = (me + 1) % W
    pk.store(y.peer(nxt), pk.load(pk.rt((16, 64), pk.f32), x, (row, 0)), (me * 32 + row, 0))
    pk.signal(flags.peer(nxt), (0, me), epoch)
    pk.signal(flags.peer(nxt), (1, 0), 1, add=True)
    pk.wait_flag(flags.local, (1, 0), 2 * epoch)
    u = pk.load(pk.rt((16, 64), pk.f32), y.peer((me + W - 1) % W), (row, 0))
    pk.store(out, u, (row, 0))


@pk.kernel(num_waves=1)
def carried(x: pk.gl[pk.f32, 2], y: pk.peers[pk.f32, 2, 3], n: pk.i32):
    """A view picked in a loop and used after it: its pointer is a loop-carried value."""
    t = pk.load(pk.rt((16, 64), pk.f32), x, (0, 0))
    v = y.local
    for p in pk.range(n):
        v = y.peer(p)
        pk.store(v, t, (p * 16, 0))
    pk.store(x, pk.load(pk.rt((16, 64), pk.f32), v, (16, 0)), (0, 0))


@pytest.fixture(scope="module")
def llvm():
    return {t: compiler.llvm_ir(exchange, t, W=WORLD) for t in TARGETS}


@pytest.fixture(scope="module")
def ptx():
    return compiler.code_object(exchange, "sm_90a", W=WORLD)["ptx"]


@pytest.fixture(scope="module")
def cdna():
    """{target: (instructions, labels)} of the code objects."""
    out = {}
    for t in CDNA:
        asm = amdgpu.disassemble(compiler.code_object(exchange, t, W=WORLD), t)
        out[t] = hsaco.instructions(asm, "exchange")
    return out


# ---- LLVM IR: the select chain, the lane-0 guard, the spin loop ------------------------------

def _defs(ir: str) -> dict:
    return dict(re.findall(r"^\s*(%[\w.]+) = (.*)$", ir, re.M))


def _depends_on(defs: dict, name: str, pattern: str, depth: int = 4) -> bool:
    """Whether the value `name` is, or is computed within `depth` steps from, an
    instruction matching `pattern`."""
    text = defs.get(name, "")
    if re.search(pattern, text):
        return True
    return depth > 0 and any(_depends_on(defs, a, pattern, depth - 1)
                             for a in re.findall(r"%[\w.]+", text))


@pytest.mark.parametrize("target", TARGETS)
def test_a_peer_view_selects_the_ranks_pointer(llvm, target):
    ir = llvm[target]
    for name in ("y", "flags"):               # member 0, then each other rank by compare
        chain = re.findall(rf"select i1 (%\w+), ptr addrspace\(1\) %{name}\.p(\d), "
                           rf"ptr addrspace\(1\) (%[\w.]+)", ir)
        assert any(r == "1" and prev == f"%{name}.p0" for _, r, prev in chain), chain
        assert any(r == "2" and prev != f"%{name}.p0" for _, r, prev in chain), chain


@pytest.mark.parametrize("target", TARGETS)
def test_signals_are_guarded_by_lane_0_and_the_bounds(llvm, target):
    ir, defs = llvm[target], _defs(llvm[target])
    lanes = 32 if target == "sm_90a" else 64
    blocks = re.findall(r"^(signal\d+):\n(.*?)^\S", ir, re.M | re.S)
    kinds = sorted("store" if "store atomic" in b else "add" for _, b in blocks)
    assert kinds == ["add", "store"], blocks
    for label, _ in blocks:
        cond = re.search(rf"br i1 (%\w+), label %{label}, label %signal_done\d+", ir).group(1)
        first = re.search(r"and i1 (%\w+), (%\w+)", defs[cond])
        assert first, defs[cond]
        lane0, ok = first.groups()
        eq0 = re.fullmatch(r"icmp eq i32 (%\w+), 0(, !dbg !\d+)?", defs[lane0])
        assert eq0 and re.fullmatch(rf"and i32 %\w+, {lanes - 1}(, !dbg !\d+)?",
                                    defs[eq0.group(1)]), (defs[lane0], defs.get(eq0.group(1)))
        assert _depends_on(defs, ok, r"icmp slt i32 .*%flags\.p0\.size\d"), defs[ok]


@pytest.mark.parametrize("target", TARGETS)
def test_wait_flag_is_an_acquire_spin_loop(llvm, target):
    ir = llvm[target]
    m = re.search(r"^(flag_spin\d+):\n(.*?)^(flag_pause\d+):\n(.*?)^(flag_done\d+):", ir,
                  re.M | re.S)
    assert m, "no spin loop"
    head, body, pause, pause_body, done = m.groups()
    assert re.search(r"load atomic i32, ptr addrspace\(1\) %\w+ acquire, align 4", body)
    assert re.search(rf"br i1 %\w+, label %{done}, label %{pause}", body)
    assert re.search(rf"br label %{head}\b", pause_body)          # the back edge
    sleep = "llvm.nvvm.nanosleep" if target == "sm_90a" else "llvm.amdgcn.s.sleep"
    assert sleep in pause_body


# ---- sm_90a: PTX -------------------------------------------------------------------------------

def _ptx_loops(ptx: str) -> list[list[str]]:
    """The instruction lines of each backward branch's span (label .. branch)."""
    lines = [x.strip() for x in ptx.splitlines()]
    at = {x[:-1]: i for i, x in enumerate(lines) if re.fullmatch(r"\$L__\w+:", x)}
    out = []
    for i, x in enumerate(lines):
        b = re.search(r"\bbra(\.uni)?\s+(\$L__\w+);", x)
        if b and at.get(b.group(2), i) < i:
            out.append(lines[at[b.group(2)]:i + 1])
    return out


def test_hopper_signal_releases_at_system_scope(ptx):
    lines = [x.strip() for x in ptx.splitlines()]
    store = [i for i, x in enumerate(lines) if x.startswith("st.release.sys.global.b32")]
    add = [i for i, x in enumerate(lines) if x.startswith("red.release.sys.global.add.u32")]
    assert len(store) == 1 and len(add) == 1, (store, add)
    # LLVM's NVPTX backend drops an atomicrmw's ordering and scope: no plain atom may remain
    assert not re.search(r"\batom\.", ptx)
    # every lane's writes are ordered before lane 0's release
    for i in store + add:
        assert any(x.startswith("bar.warp.sync") for x in lines[max(0, i - 12):i]), \
            lines[max(0, i - 12):i + 1]


def test_hopper_wait_flag_acquires_at_system_scope_in_a_loop(ptx):
    spins = [body for body in _ptx_loops(ptx)
             if any(x.startswith("ld.acquire.sys.global.b32") for x in body)]
    assert spins and any(x.startswith("nanosleep.u32") for x in spins[0]), _ptx_loops(ptx)
    last = max(i for i, x in enumerate(ptx.splitlines()) if "ld.acquire.sys.global" in x)
    # TMA copies issued afterwards read through the async proxy
    assert "fence.proxy.async.global;" in "\n".join(ptx.splitlines()[last:])


def test_hopper_has_no_spills():
    rep = compiler.report(exchange, "sm_90a", W=WORLD)
    assert rep["spill_bytes"] == 0 and rep["stack_bytes"] == 0, rep


# ---- gfx942, gfx950: code objects ----------------------------------------------------------------

SYSTEM_RELEASE = ("buffer_wbl2", "sc0 sc1")       # write back L2 to memory, then wait
SYSTEM_ACQUIRE = ("buffer_inv", "sc0 sc1")        # invalidate the caches after the load


def _text(inst) -> str:
    return f"{inst[0]} {inst[1]}".strip()


def _released(insts, i) -> bool:
    """Instruction i is preceded by a system-scope writeback, then a wait for every earlier
    memory access, with no memory access in between."""
    for j in range(i - 1, max(-1, i - 8), -1):
        op, arg = insts[j]
        if (op, arg) == SYSTEM_RELEASE:
            return any(o == "s_waitcnt" and "vmcnt(0)" in a for o, a in insts[j + 1:i])
        if op.startswith(("global_", "buffer_", "flat_")):
            return False
    return False


@pytest.mark.parametrize("target", CDNA)
def test_cdna_signal_releases_at_system_scope(cdna, target):
    insts, _ = cdna[target]
    store = [i for i, (op, arg) in enumerate(insts) if op == "global_store_dword"]
    add = [i for i, (op, arg) in enumerate(insts) if op.startswith("global_atomic_add")]
    assert len(store) == 1 and len(add) == 1, [_text(x) for x in insts if "global" in x[0]]
    assert insts[store[0]][1].endswith("sc0 sc1"), _text(insts[store[0]])   # system scope
    assert insts[add[0]][1].endswith("sc1"), _text(insts[add[0]])
    for i in store + add:
        assert _released(insts, i), [_text(x) for x in insts[max(0, i - 8):i + 1]]
        # lane 0 only: the access runs under an exec mask set just before it
        assert any(op == "s_and_saveexec_b64" for op, _ in insts[max(0, i - 24):i])


@pytest.mark.parametrize("target", CDNA)
def test_cdna_wait_flag_acquires_at_system_scope_in_a_loop(cdna, target):
    insts, labels = cdna[target]
    spins = []
    for lp in hsaco.loops(insts, labels):
        body = lp.instructions(insts)
        loads = [k for k, (op, arg) in enumerate(body)
                 if op == "global_load_dword" and arg.endswith("sc0 sc1")]
        if loads and SYSTEM_ACQUIRE in body[loads[0]:]:
            spins.append(body)
    assert len(spins) == 1, [[_text(x) for x in lp.instructions(insts)]
                             for lp in hsaco.loops(insts, labels)]
    assert any(op == "s_sleep" for op, _ in spins[0])
    # the wave branches on one lane's copy: a scalar compare, no exec-mask loop
    assert any(op == "v_readfirstlane_b32" for op, _ in spins[0])


@pytest.mark.parametrize("target", CDNA)
def test_cdna_peer_views_pick_in_scalar_registers(cdna, target):
    insts, _ = cdna[target]
    # two selects (one per pointer half) per non-first rank, per view: 4 views x 2 ranks
    assert sum(op == "s_cselect_b32" for op, _ in insts) >= 4 * 2 * 2


@pytest.mark.parametrize("target", CDNA)
def test_cdna_has_no_scratch(target):
    rep = compiler.report(exchange, target, W=WORLD)
    assert rep["scratch_bytes"] == 0 and (rep["vgpr_spill"], rep["sgpr_spill"]) == (0, 0), rep


# ---- views carried through control flow; what launches check as written -----------------------

@pytest.mark.parametrize("target", TARGETS)
def test_a_view_picked_in_a_loop_is_carried_out_of_it(target):
    ir = compiler.llvm_ir(carried, target)
    # before its first pick (the loop may not run) the view is rank 0's tensor
    assert re.search(r"= phi ptr addrspace\(1\) \[ %y\.p0, %\w+ \], \[ %\w+, %\w+ \]", ir)
    rep = compiler.report(carried, target)
    spills = (rep["spill_bytes"], rep["stack_bytes"]) if target == "sm_90a" else \
        (rep["scratch_bytes"], rep["vgpr_spill"], rep["sgpr_spill"])
    assert not any(spills), rep


@pytest.mark.parametrize("target", TARGETS)
def test_writes_through_a_view_count_for_every_rank(target):
    prog = compiler.lane_ir(exchange, target, W=WORLD)
    members = {f"{n}.p{i}" for n in ("y", "flags") for i in range(WORLD)}
    assert written_params(prog) == members | {"out"}


@pk.kernel(num_waves=1)
def local_flags(x: pk.gl[pk.f32, 2], flags: pk.gl[pk.i32, 1]):
    """Flags between workgroups of one GPU (scope="gpu"): write, publish, count, wait."""
    pk.store(x, pk.load(pk.rt((16, 64), pk.f32), x, (0, 0)), (16, 0))
    pk.signal(flags, 0, 1, scope="gpu")
    pk.signal(flags, 1, 1, add=True, scope="gpu")
    pk.wait_flag(flags, 2, 1, scope="gpu")


def test_gpu_scope_flags_release_and_acquire_at_gpu_scope():
    """scope="gpu" gives PTX's .gpu forms, and on CDNA the agent scope's cache bits (sc1,
    not the system scope's sc0 sc1) on the store, its write-back and the acquire's
    invalidate."""
    ptx = compiler.code_object(local_flags, "sm_90a")["ptx"]
    ops = [x.split()[0] for x in ptx.splitlines() if "release" in x or "acquire" in x]
    assert set(ops) == {"st.release.gpu.global.b32", "red.release.gpu.global.add.u32",
                        "ld.acquire.gpu.global.b32"}, ops
    for t in CDNA:
        insts, _ = hsaco.instructions(amdgpu.disassemble(compiler.code_object(local_flags, t),
                                                         t), "local_flags")
        scoped = [(op, arg) for op, arg in insts
                  if op in ("global_store_dword", "buffer_wbl2", "buffer_inv")
                  or op == "global_load_dword" and "offset:8" in arg]
        assert scoped and all(arg.endswith("sc1") and "sc0" not in arg
                              for _, arg in scoped), scoped


def test_flag_scope_names():
    with pytest.raises(pk.KernelError, match="scope is one of 'system', 'gpu'"):
        compiler.lane_ir(pk.kernel(num_waves=1)(_bad_scope), "sm_90a")


def _bad_scope(flags: pk.gl[pk.i32, 1]):
    pk.signal(flags, 0, 1, scope="device")

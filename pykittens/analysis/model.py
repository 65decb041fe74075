"""A performance model of the library kernels, read from their compiled code objects.

GEMMs (below), Hopper's attention forward and backward (the same per-iteration accounting
over the consumer warpgroups' wgmma loop, plus the special-function unit), and the Hopper
row kernels (streaming: their tensors' bytes at the copy bandwidth measured on the H200;
`_model_sm90`).

`model(kernel, target, shape, dtype)` compiles the kernel as its launcher would for that
shape, reads the executed main loop of the code object (CDNA: the interior path of the
hsaco's main loop, instruction by instruction; Hopper: the SASS of the innermost wgmma
loops), and counts, per compute unit (CU / SM) and per main-loop iteration (one K step of
every workgroup resident on it), the cycles each resource needs:

- matrix: MFMA passes x cycles per pass (CDNA) / wgmma FLOPs over the tensor cores' FLOPs
  per SM per clock, as back-to-back wgmma reach on the H200 (Hopper);
- issue: instructions a wave / warp issues per iteration at the target's issue rate;
- lds: bytes read and written in LDS / shared memory over its bytes per clock;
- vmem, l2 (CDNA): bytes of the vector memory instructions over the vL1D and the CU's
  share of its XCD's L2;
- dram: the launch's HBM bytes from the cache simulator for the launch's grid mapping, over
  the data-sheet bandwidth, spread over the busiest CU's iterations;
- waits (Hopper): the consumer warpgroups stepped through their loops' waits for their own
  wgmma groups, their fenced arrives and the barriers they hand tiles over at, sharing the
  tensor cores, issue slots and special-function units (_overlap_cycles): what the others,
  each summed alone, leave out.

Beside them, not a bound (Hopper attention backward): dQ's additions into its f32 sum by the
TMA unit at the rate measured on the H200 for as many workgroups adding into the same rows
(`beside`, "reduce"). With each key block adding into rows of its own (a rotated walk,
docs/PERF.md run OA) the main pass took the same time where a bound by it predicted 22-46%
faster; what holds the consumers is their own dQ work (dS handed to each other through a
barrier, f32 blocks stored and fenced), which the waits step through.

Time = the largest of them x the busiest CU's iterations / clock: the resources are assumed
to overlap completely (CDNA: the 8-wave ping-pong runs one group's MFMA cluster beside the
other group's memory cluster; Hopper: the producer warp's TMA copies run beside the consumer
warpgroups' wgmmas). Every hardware number comes from `Target.fact` (pykittens/targets,
cited there); nothing is fitted to a measurement (docs/PERF.md compares with the H200)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .. import targets

# the row kernels: streaming, modelled by their bytes (_model_sm90)
ROWS = ("layernorm", "layernorm_bwd", "rmsnorm", "rmsnorm_bwd", "add_rmsnorm",
        "add_rmsnorm_bwd", "softmax", "softmax_bwd", "rope", "column_sum",
        # the norms' backward adding up their own column sums (kernels.rows.FUSED_SUMS)
        "layernorm_bwd_fused", "rmsnorm_bwd_fused", "add_rmsnorm_bwd_fused")
# kernel -> targets it is modelled on
MODELED = {"gemm_ws": ("sm_90a",), "gemm_pingpong": ("gfx942", "gfx950"),
           "gemm_basic": ("gfx942", "gfx950"), "attention_fwd": ("sm_90a",),
           "attention_bwd": ("sm_90a",),
           **{k: ("sm_90a",) for k in ROWS}}
# library kernels with no model yet, and why (named in the error asking for one)
UNMODELED = {"gemm_sk": "its consumers wait for the ring's copies, B arriving at 2.8 TB/s "
                        "where the same reads alone stream at 3.5 (docs/PERF.md runs UC, "
                        "UE): a loss inside its workgroups that no term of the model "
                        "accounts for yet"}
_FP8 = {"e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"}


def not_modeled(kernel_name: str) -> str:
    """The error text for a kernel with no performance model."""
    why = f" ({kernel_name} is not: {UNMODELED[kernel_name]})" if kernel_name in UNMODELED \
        else ""
    return (f"no performance model for {kernel_name!r}{why}; modelled kernels: "
            f"{', '.join(MODELED)}")


@dataclass(frozen=True)
class Launch:
    """How the library launches one shape: the kernel, its grid and constants, the output
    block (bm x bn), the K step (bk) and, for a persistent launch, its workgroups.

    The plan comes from the caller (`plan=` of `model`; the library's is
    `pykittens.cli.library_plan`): the launch rules live in pykittens.kernels, which sits
    above this package (runtime reads analysis; kernels reach the runtime through the
    emulator), so analysis may not import them (docs/architecture.md, tests/test_layering)."""
    kernel: object
    grid: tuple
    consts: dict
    bm: int
    bn: int
    bk: int
    persistent: int | None = None
    # attention: each workgroup's main-loop iterations, in launch order
    iterations: tuple = ()
    # row kernels: the bytes of the launch's tensors (each read or written once); attention's
    # backward: its passes before and after the main one, which stream this many bytes
    tensor_bytes: int = 0
    # a norm's backward: (rows, columns) of the partial column sums it leaves for column_sum
    partial_sums: tuple = ()
    # attention's backward: the bytes the TMA unit adds into L2 each iteration (dQ's f32 sum),
    # and how many workgroups add into the same rows at once
    reduce_bytes: int = 0
    reduce_share: int = 1


def _itemsize(dtype: str) -> int:
    from ..ir.types import dtype_of
    return dtype_of(dtype).bytes


def _compile(kernel, t, consts):
    """(lane program, code object): the stages of pykittens.compiler, which imports this
    package and so cannot be imported from it. Code objects come from the disk cache."""
    from ..codegen import render
    from ..lang.kernel import require_kernel
    from ..lower import lower
    prog = lower(require_kernel(kernel, "modelling").specialize_for(t, **consts), t)
    ir = render(prog, 16)
    if t.family == "cdna":
        from ..toolchain import amdgpu
        return prog, amdgpu.compile_ir(ir, t.name)
    from ..toolchain import nvptx
    return prog, nvptx.compile_ir(ir, t.name)


# ---------------------------------------------------------------------------- CDNA

def _lane_bytes(mnemonic: str) -> int:
    """Bytes one lane moves with a vector-memory or LDS instruction, from its mnemonic
    (CDNA3/4 ISA: buffer_load_dwordx4 16, ds_read_b128 16, ds_read2_b64 2 x 8,
    ds_read_b64_tr_b16 8, buffer_load_ubyte 1)."""
    m = mnemonic
    if "dwordx" in m:
        return 4 * int(re.search(r"dwordx(\d)", m).group(1))
    if re.search(r"_(u|s)byte|_byte", m):
        return 1
    if re.search(r"_(u)?short", m):
        return 2
    if "dword" in m:
        return 4
    b = re.search(r"_b(\d+)", m)
    bits = int(b.group(1)) if b else 32
    return bits // 8 * (2 if re.match(r"ds_(read|write)2", m) else 1)


def _cdna_loop(kernel, t, consts):
    """The report and the executed main-loop instructions (mnemonic, operands) of one wave."""
    from ..toolchain import amdgpu
    from . import hsaco
    prog, obj = _compile(kernel, t, consts)
    rep = hsaco.report(obj, t.name, num_waves=prog.num_waves)
    asm = amdgpu.disassemble(obj, t.name)
    insts, labels = hsaco.instructions(asm, rep["kernel"])
    main = hsaco.main_loop(insts, labels)
    if main is None:
        raise ValueError(f"{rep['kernel']} on {t.name} has no main loop to model")
    lines = hsaco.line_of_addresses(obj, hsaco.addresses(asm, rep["kernel"]))
    path = [insts[i] for i in hsaco.interior_path(insts, labels, main, lines)]
    return rep, path


def _cdna_cycles(t, rep, path, consts_used):
    from . import hsaco
    pass_cyc = _fact(t, "mfma_pass_cycles", consts_used)
    issue = _fact(t, "issue_cycles_per_instruction", consts_used)
    lds_bw = _fact(t, "lds_bytes_per_clk", consts_used)
    vmem_bw = _fact(t, "vmem_bytes_per_clk", consts_used)
    l2_bw = _fact(t, "l2_bytes_per_clk_per_xcd", consts_used) / t.cus_per_xcd
    wave = t.wave_size
    passes = {ins.name: ins.passes for ins in t.mma}
    mfma_cyc = lds_bytes = vmem_bytes = 0
    n_mfma = 0
    for op, args in path:
        cls = hsaco.classify(op)
        if cls == "mfma":
            if op not in passes:
                raise ValueError(f"{op} is not in {t.name}'s MFMA table (targets); add its "
                                 "passes there to model it")
            mfma_cyc += passes[op] * pass_cyc
            n_mfma += 1
        elif cls == "vmem":
            nbytes = _lane_bytes(op) * wave
            vmem_bytes += nbytes
            if re.search(r"\blds\b", args):          # direct global -> LDS load
                lds_bytes += nbytes
        elif cls == "ds":
            lds_bytes += _lane_bytes(op) * wave
    waves_wg = rep["num_waves"]
    simd_waves = rep["occupancy_waves_per_simd"]
    wgs = max(simd_waves * t.simds_per_cu // waves_wg, 1)
    waves_cu = wgs * waves_wg
    per_simd = math.ceil(waves_cu / t.simds_per_cu)
    others = len(path) - n_mfma
    cycles = {
        # the SIMD's matrix core runs the MFMAs of all its waves one after another
        "matrix": per_simd * mfma_cyc,
        # a wave issues its own instructions in order: its MFMAs (each holds the matrix
        # core for its cycles) and every other instruction, one per issue slot
        "issue": mfma_cyc + others * issue,
        "lds": waves_cu * lds_bytes / lds_bw,
        "vmem": waves_cu * vmem_bytes / vmem_bw,
        "l2": waves_cu * vmem_bytes / l2_bw,
    }
    detail = {"waves_per_cu": waves_cu, "workgroups_per_cu": wgs, "mfma_per_wave": n_mfma,
              "instructions_per_wave": len(path),
              "lds_bytes_per_wave": lds_bytes, "vmem_bytes_per_wave": vmem_bytes}
    return cycles, wgs, detail


# ---------------------------------------------------------------------------- Hopper

_SHAPE = re.compile(r"^[HQIB]GMMA\.(\d+)x(\d+)x(\d+)")


def _hopper_loops(kernel, t, consts):
    """(report, [(instructions, [(m, n, k, a_in_smem)], MUFU instructions, _loop_events)]
    of the executed path of each innermost wgmma loop): an interior iteration takes the
    loop's shortest path from its header back to it (the fewest instructions), which leaves
    out what only some iterations run (attention's masked blocks and O's rescale)."""
    from . import cubin
    from .cfg import natural_loops
    prog, res = _compile(kernel, t, consts)
    rep = cubin.report(res)
    rep["smem_bytes"] = (rep.get("smem_bytes") or 0) + prog.lds_bytes   # dynamic smem
    rep["num_waves"] = prog.num_waves
    sass, why = cubin.disassemble(res["cubin"]) if res.get("cubin") else (None, "no cubin")
    if sass is None:
        raise ValueError(f"the Hopper model reads the SASS: {why}")
    instrs, labels = cubin.parse_sass(sass)[rep["kernel"]]
    blocks, succs = cubin.cfg(instrs, labels)
    loops = natural_loops(succs)

    def wg(body):
        return [instrs[i] for b in body for i in blocks[b] if instrs[i].op in cubin.WGMMA_OPS]
    with_mma = {h: body for h, body in loops.items() if wg(body)}
    inner = [h for h, body in with_mma.items()
             if not any(o != h and with_mma[o] < body for o in with_mma)]
    out = []
    for h in sorted(inner):
        path = _shortest_cycle(h, with_mma[h], blocks, succs)
        shapes = []
        for ins in wg(path):
            mm = _SHAPE.match(ins.opcode)
            ops = [o.strip() for o in ins.operands.split(",")]
            shapes.append((*map(int, mm.groups()), len(ops) > 1 and ops[1].startswith("gdesc")))
        mufu = sum(instrs[i].op == "MUFU" for b in path for i in blocks[b])
        out.append((sum(len(blocks[b]) for b in path), shapes, mufu,
                    _loop_events([instrs[i] for b in path for i in blocks[b]])))
    if not out:
        raise ValueError(f"{rep['kernel']} has no wgmma loop to model")
    return rep, out


def _loop_events(path) -> list[tuple]:
    """One iteration of a consumer's loop (its SASS path, in program order) as what it waits
    on: ("alu", instructions, MUFU instructions) runs it issues, ("mma", FLOPs) each wgmma
    group it commits (the HGMMAs up to the one marked gsb0), ("wait", n) each
    WARPGROUP.DEPBAR.LE gsb0, n (until at most n of its groups are unfinished), ("fence",)
    each MEMBAR (what fence.proxy.async before an arrive becomes), and ("sync", i) the i-th
    mbarrier of the iteration it arrives at and then waits on (SYNCS.ARRIVE, then
    SYNCS.PHASECHK on the same address: a hand-over between the consumers, such as
    attention_bwd's dS). Waits on barriers it does not arrive at (the producer's copies) are
    taken as passed: the producer runs ahead."""
    from .cubin import WGMMA_OPS
    events, issued, mufu, flops, arrived, syncs = [], 0, 0, 0, set(), 0

    def cut(event):
        nonlocal issued, mufu
        events.extend([("alu", issued, mufu), event])
        issued = mufu = 0
    for ins in path:
        issued += 1
        mufu += ins.op == "MUFU"
        if ins.op in WGMMA_OPS:
            m, n, k = map(int, _SHAPE.match(ins.opcode).groups())
            flops += 2 * m * n * k
            if "gsb0" in ins.operands:
                cut(("mma", flops))
                flops = 0
        elif ins.opcode.startswith("WARPGROUP.DEPBAR"):
            cut(("wait", int(ins.operands.split(",")[-1], 0)))
        elif ins.op == "MEMBAR":
            cut(("fence",))
        elif ins.op == "SYNCS" and "[" in ins.operands:
            where = ins.operands[ins.operands.index("["):ins.operands.index("]") + 1]
            if ".ARRIVE" in ins.opcode:
                arrived.add(where)
            elif ".PHASECHK" in ins.opcode and where in arrived:
                arrived.discard(where)
                cut(("sync", syncs))
                syncs += 1
    events.append(("alu", issued, mufu))
    return [e for e in events if e[0] != "alu" or e[1]]


PHASES = 8          # starting offsets of the consumers the waits' model averages over
WAITS = ("waits: each consumer steps through its loop's SASS, committing its wgmma groups "
         "and waiting for them where it does (WARPGROUP.DEPBAR); the tensor cores share their "
         "rate evenly among the warpgroups with groups unfinished (how a sub-partition's "
         "tensor core picks between two warpgroups' instructions is not documented; "
         "first-come-first-served matched the H200's attention far worse, docs/PERF.md); "
         "a consumer's instructions and MUFU share the issue slots and special-function "
         "units with the others'; a group's results are there a measured latency after "
         "its products are done (wgmma_latency_clk; the next group's products run "
         "meanwhile); an arrive fenced for the async proxy (MEMBAR) completes a measured "
         "time after the consumer's groups' products are done (async_fence_clk); a "
         "barrier every consumer arrives at and waits on holds each until all have "
         "arrived; the mean over the consumers' relative starts (_waits_cycles)")


def _waits_cycles(loops: list, rate: float, issue: float, mufu_clocks: float,
                  pingpong: bool, latency: float = 0.0, fence: float = 0.0
                  ) -> tuple[float, list[float]]:
    """(mean, per phase) of _overlap_cycles over PHASES relative starts of the consumers:
    consumer c starting c x s cycles after the first, s = k / PHASES of an iteration's
    tensor-core time over (consumers - 1), k = 0 .. PHASES - 1. Nothing in a schedule
    without ping-pong fixes how the consumers' iterations line up (in phase, their
    products and softmaxes coincide; half an iteration apart, one's products run under the
    other's softmax), and the stepping keeps whichever alignment it starts from, so the
    model takes the mean over starts: a tile's time is its iterations at the period of
    the alignment it falls into. A loop that commits no group in itself (none marked
    gsb0) is not stepped: (0, [])."""
    if not all(any(kind == "mma" for kind, *_ in ev) for ev in loops):
        return 0.0, []
    tensor = sum(f for ev in loops for kind, *arg in ev if kind == "mma" for f in arg) / rate
    spread = tensor / max(1, len(loops) - 1)
    per = [_overlap_cycles(loops, rate, issue, mufu_clocks, pingpong,
                           stagger=spread * k / PHASES, latency=latency, fence=fence)
           for k in range(PHASES)]
    return sum(per) / len(per), per


def _overlap_cycles(loops: list, rate: float, issue: float, mufu_clocks: float,
                    pingpong: bool, iterations: int = 24, stagger: float = 0.0,
                    latency: float = 0.0, fence: float = 0.0) -> float:
    """Cycles an SM takes per iteration of every consumer (`loops`: each consumer's
    _loop_events, all resident at once), stepping the consumers through their waits. The
    tensor cores run the groups committed and not finished at `rate` FLOPs a clock, shared
    out evenly among the warpgroups that have any (each warpgroup's in order; one alone
    reaches the same rate as several, bench/gpu_clock.py). A consumer's "alu" run issues
    its instructions at `issue` a clock and its MUFU instructions at `mufu_clocks` each,
    both shared with the other consumers' runs (a consumer puts one warp on each
    sub-partition). Ping-pong: a consumer commits the first group of round r only after the
    one before it has committed all of its round r (the first: the last's round r - 1).
    A group's results are there `latency` cycles after its products are done (a wait
    holds until then; the tensor cores go on with the next group meanwhile). A "fence"
    holds until the consumer's groups' products are done, then `fence` cycles more (the
    H200's fenced arrive: bench/gpu_clock.py --fence). The i-th "sync" of an iteration holds
    a consumer until every consumer has reached its i-th sync of the same iteration (loops
    whose syncs differ in number are stepped without them).
    Consumer c starts `c x stagger` cycles after the first. The steady state's cycles per
    iteration, from the second half of `iterations`."""
    consumers = len(loops)
    if len({sum(e[0] == "sync" for e in ev) for ev in loops}) > 1:
        loops = [[e for e in ev if e[0] != "sync"] for ev in loops]
    held = [None] * consumers          # when a consumer's fence completes (None: not in one)
    synced = {}                        # (sync, iteration) -> consumers there
    first = [next(i for i, e in enumerate(ev) if e[0] == "mma") for ev in loops]
    last = [max(i for i, e in enumerate(ev) if e[0] == "mma") for ev in loops]
    pc = [0] * consumers
    left = [None] * consumers          # (instructions, MUFU) left of the run a consumer is in
    queue = [[] for _ in range(consumers)]
    rounds = [0] * consumers           # iterations whose groups a consumer has committed
    done = [[] for _ in range(consumers)]
    draining = [[] for _ in range(consumers)]   # when done groups' results are there
    clock, step = 0.0, 2.0
    while min(len(d) for d in done) < iterations:
        if clock > 1e8:
            raise RuntimeError("the consumers' loops never finish an iteration: a sync or "
                               "ping-pong turn none of them can pass")
        busy = [c for c in range(consumers) if queue[c]]
        for c in busy:                 # the tensor cores
            queue[c][0] -= rate / len(busy) * step
            if queue[c][0] <= 0:
                queue[c].pop(0)
                if latency:
                    draining[c].append(clock + step + latency)
        issuing = [c for c in range(consumers) if left[c] is not None]
        exp = sum(1 for c in issuing if left[c][1] > 0)
        for c in issuing:
            n, f = left[c]
            left[c] = (n - issue * step / len(issuing),
                       f - step / (mufu_clocks * exp) if f > 0 else f)
        clock += step
        for c in range(consumers):     # each consumer as far as its waits let it go
            if clock < c * stagger:
                continue
            while True:
                kind, *arg = loops[c][pc[c]]
                if kind == "alu":
                    if left[c] is None:
                        left[c] = (arg[0], arg[1])
                    if left[c][0] > 0 or left[c][1] > 0:
                        break
                    left[c] = None
                elif kind == "wait":
                    while draining[c] and draining[c][0] <= clock:   # in time order
                        draining[c].pop(0)
                    if len(queue[c]) + len(draining[c]) > arg[0]:
                        break
                elif kind == "fence":
                    if held[c] is None:
                        if queue[c]:
                            break
                        held[c] = clock + fence
                    if clock < held[c]:
                        break
                    held[c] = None
                elif kind == "sync":
                    there = synced.setdefault((arg[0], len(done[c])), set())
                    there.add(c)
                    if len(there) < consumers:
                        break
                else:
                    if pingpong and pc[c] == first[c] and \
                            rounds[(c - 1) % consumers] < rounds[c] + (c > 0):
                        break
                    queue[c].append(arg[0])
                    rounds[c] += pc[c] == last[c]
                pc[c] = (pc[c] + 1) % len(loops[c])
                if pc[c] == 0:
                    done[c].append(clock)
                    break
    half = iterations // 2
    return sum((d[-1] - d[half - 1]) / (len(d) - half) for d in done) / consumers


def _shortest_cycle(header, body, blocks, succs) -> list[int]:
    """The blocks of the cheapest way (fewest instructions) from a loop's header back to it
    inside the loop's body: Dijkstra from the header, closed by the cheapest back edge."""
    import heapq
    dist, prev = {header: len(blocks[header])}, {}
    heap = [(dist[header], header)]
    while heap:
        cost, b = heapq.heappop(heap)
        if cost > dist[b]:
            continue
        for s in succs[b]:
            if s != header and s in body and cost + len(blocks[s]) < dist.get(s, 1 << 60):
                dist[s], prev[s] = cost + len(blocks[s]), b
                heapq.heappush(heap, (dist[s], s))
    b = min((u for u in dist if header in succs[u]), key=dist.get)
    path = [b]
    while b in prev:
        b = prev[b]
        path.append(b)
    return path[::-1]


def _hopper_cycles(t, dtype, loops, fills, consts_used, pingpong=False):
    """Cycles per main-loop iteration on one SM of the consumer warpgroups' loops (one copy
    each, all running at once): the tensor cores, each sub-partition's issue slot and
    special-function unit (a consumer warpgroup puts one warp on every sub-partition),
    shared memory (wgmma's operand reads plus `fills`, the TMA copies of an iteration), and
    "waits": the consumers stepped through their waits for their own products
    (_waits_cycles), which the other resources take as overlapping completely."""
    esz = _itemsize(dtype)
    measured = f"wgmma_flops_per_clk/{'e4m3' if dtype in _FP8 else 'bf16'}"
    if t.has_fact(measured):          # what back-to-back wgmma reach, measured on the chip
        per_sm = _fact(t, measured, consts_used)
    else:                             # the data sheet's peak over the SMs and its clock
        peak_name = "dense_fp8_flops" if dtype in _FP8 else "dense_bf16_flops"
        peak = _fact(t, peak_name, consts_used)
        clock = consts_used["clock_hz"][0]
        per_sm = peak / (t.num_cus * clock)
        consts_used["tensor_flops_per_clk_per_sm"] = (
            per_sm, f"{peak_name} / (SMs x clock): {peak:.4g} / ({t.num_cus} x {clock:.4g})")
    smem_bw = _fact(t, "smem_bytes_per_clk", consts_used)
    issue = _fact(t, "issue_per_clk_per_subpartition", consts_used)
    mufu_rate = _fact(t, "mufu_per_clk_per_sm", consts_used) / 4      # per sub-partition
    flops = sum(2 * m * n * k for _, shapes, _, _ in loops for m, n, k, _ in shapes)
    reads = sum(((m * k) if a_smem else 0) * esz + n * k * esz
                for _, shapes, _, _ in loops for m, n, k, a_smem in shapes)
    cycles = {"matrix": flops / per_sm,
              "issue": sum(n for n, _, _, _ in loops) / issue,
              "mufu": sum(32 * f for _, _, f, _ in loops) / mufu_rate,
              "lds": (reads + fills) / smem_bw}
    events = [ev for _, _, _, ev in loops]
    fenced = any(e[0] == "fence" for ev in events for e in ev)
    cycles["waits"], per_phase = _waits_cycles(
        events, per_sm, issue, 32 / mufu_rate, pingpong,
        _fact(t, "wgmma_latency_clk", consts_used),
        _fact(t, "async_fence_clk", consts_used) if fenced else 0.0)
    detail = {"wgmma_loops": len(loops), "wgmma_per_loop": [len(s) for _, s, _, _ in loops],
              "wgmma_shape": "x".join(map(str, loops[0][1][0][:3])),
              "instructions_per_loop": [n for n, _, _, _ in loops],
              "mufu_per_loop": [f for _, _, f, _ in loops],
              "waits_cycles_per_phase": [round(c, 1) for c in per_phase],
              "smem_bytes_per_iteration": reads + fills}
    return cycles, detail


# ---------------------------------------------------------------------------- model

def _fact(t, name, used):
    v, src = t.fact(name)
    used[name] = (v, src)
    return v


def matrix_peak_flops(target, dtype="bf16", chip=None) -> float:
    """The target's dense matrix peak in FLOP/s for `dtype` (CDNA: its fastest MFMA for the
    type at the chip's clock; Hopper: NVIDIA's published dense peak)."""
    t = targets.get(target)
    chip = chip or t.chips[-1]
    clock = t.fact(f"clock_hz/{chip}")[0]
    if t.family == "hopper":
        return t.fact("dense_fp8_flops" if dtype in _FP8 else "dense_bf16_flops")[0]
    ab = _operand_type(t, dtype)
    rate = max(2 * i.m * i.n * i.k / (i.passes * t.fact("mfma_pass_cycles")[0])
               for i in t.mma if i.ab_dtype == ab and i.passes and not i.scaled)
    return rate * t.simds_per_cu * t.num_cus * clock


def _operand_type(t, dtype):
    """fp8 names the target's own flavour: e4m3 on gfx942 is e4m3fnuz."""
    if t.fp8_flavor == "fnuz" and dtype in ("e4m3", "e5m2"):
        return dtype + "fnuz"
    return dtype


def _nearest_share(t, share: int) -> int:
    """Of the sharings the TMA reduction's rate was measured at (tma_reduce_bytes_per_s/N),
    the nearest to `share` workgroups adding into the same tile (by ratio)."""
    measured = [int(name.rsplit("/", 1)[1]) for name, _, _ in t.perf_facts
                if name.startswith("tma_reduce_bytes_per_s/")]
    return min(measured, key=lambda m: abs(math.log(m / share)))


def _chip(t, chip: str | None) -> str:
    """The chip of the target a model is for (default its newest), or an error naming them."""
    chip = chip or t.chips[-1]
    if chip not in t.chips:
        raise ValueError(f"{t.name} is {' or '.join(t.chips)}, not {chip}")
    return chip


def _clocks(t, chip: str, used: dict) -> tuple[float, float]:
    """(peak clock, the clock the kernel runs at): the chip's measured clock under a
    tensor-bound load where there is one (an H200 holds its power cap lower), else the peak
    clock; both noted in `used` (the peak as clock_hz)."""
    clock = _fact(t, f"clock_hz/{chip}", used)
    used["clock_hz"] = used.pop(f"clock_hz/{chip}")
    load = f"load_clock_hz/{chip}"
    return clock, _fact(t, load, used) if t.has_fact(load) else clock


def model(kernel_name: str, target, shape, dtype: str = "bf16", *, plan=None,
          chip: str | None = None, out_dtype: str | None = None, **overrides) -> dict:
    """Modeled time (and TFLOP/s) of one library launch (module docstring). `shape` is
    (M, N, K) of C[M, N] = A[M, K] B^T for a GEMM, (B, Hq, Hkv, N, D) for attention_fwd
    and attention_bwd (`causal=True` in overrides for the causal form), (rows, cols) for a
    row kernel; `plan(kernel_name, target, m, n, k, dtype,
    out_dtype) -> Launch` says how the library launches it (`pykittens.cli.library_plan`;
    `Launch` says why it is passed in); `chip` one of the target's chips (default its last:
    MI325X, MI355X, H200); `out_dtype` C's type (default: the operands' for 16-bit types,
    bf16 for fp8); `overrides` replace launch constants (e.g. BK=16) to ask "what if"."""
    if plan is None:
        raise ValueError("model() needs plan=, the library's launch rules: pass "
                         "pykittens.cli.library_plan (or run `pykittens model`)")
    if kernel_name in ("attention_fwd", "attention_bwd") or kernel_name in ROWS:
        return _model_sm90(kernel_name, target, shape, dtype, plan, chip, **overrides)
    if kernel_name not in MODELED:
        raise ValueError(not_modeled(kernel_name))
    t = targets.get(target)
    if t.name not in MODELED[kernel_name]:
        raise ValueError(f"{kernel_name} is modelled on {', '.join(MODELED[kernel_name])}, not "
                         f"{t.name}; pick --target {MODELED[kernel_name][0]}"
                         + ("" if t.family == "cdna" else
                            " (on sm_90a model gemm_ws: mma.sync's rate is not a sourced "
                            "fact)"))
    m, n, k = (int(x) for x in shape)
    if min(m, n, k) < 1:
        raise ValueError(f"shape sizes must be >= 1, got {m} {n} {k}")
    chip = _chip(t, chip)
    dtype = _operand_type(t, dtype)
    if dtype not in t.dtypes or dtype in ("f32", "i32", "e8m0", "e2m1x2", "e2m3p", "e3m2p"):
        raise ValueError(f"{kernel_name} on {t.name} takes bf16, f16 or fp8 operands, "
                         f"not {dtype}")
    out = out_dtype or ("bf16" if dtype in _FP8 else dtype)
    if kernel_name == "gemm_basic":
        out = out_dtype or "f32"                  # its library spec's output
    used: dict = {}
    clock, run_clock = _clocks(t, chip, used)
    measured_load = t.has_fact(f"load_clock_hz/{chip}")
    lp = plan(kernel_name, t.name, m, n, k, dtype, out)
    kernel, grid, consts = lp.kernel, lp.grid, lp.consts
    bm, bn, bk, persistent = lp.bm, lp.bn, lp.bk, lp.persistent
    fixed = {"DT", "OUT", "MAP", "TM", "TN", "TARGET", "BM", "BN", "PERSISTENT"}
    bad = sorted(set(overrides) & fixed | set(overrides) - set(kernel.const_names))
    if bad:
        free = sorted(set(kernel.const_names) - fixed)
        raise ValueError(f"cannot override {', '.join(bad)} of {kernel_name}: the tile grid "
                         f"and types follow the shape and --dtype; overridable: "
                         f"{', '.join(free) or 'none'}")
    consts = {**consts, "DT": dtype, "OUT": out, **overrides}
    bn = consts.get("BN", bn)
    bk = consts.get("BK", bk) or bk
    assumptions = [
        "resources overlap completely: time = the busiest resource's cycles per iteration "
        "x the busiest CU's iterations / clock",
        (f"the kernel runs at {chip}'s measured clock under a tensor-bound load "
         f"({run_clock / 1e9:.2f} GHz: load_clock_hz) throughout; per-clock rates are the "
         f"hardware's at its {clock / 1e9:.2f} GHz peak clock" if measured_load else
         f"the clock is the chip's peak engine / boost clock ({clock / 1e9:.2f} GHz) "
         "throughout, no throttling (no clock under load measured for it)"),
        "prologue, epilogue (C stores) and pipeline fill are not counted, except C's bytes "
        "in dram",
        "latencies (s_waitcnt / mbarrier waits) are hidden by the schedule",
    ]
    if t.family == "cdna":
        rep, path = _cdna_loop(kernel, t, consts)
        cycles, wgs, detail = _cdna_cycles(t, rep, path, used)
        slots = t.num_cus * wgs
        tiles = grid[0] if len(grid) == 1 else math.prod(grid)
        steps = math.ceil(k / bk)
        iters = math.ceil(tiles / slots) * steps
        assumptions += [
            "every wave of a workgroup runs the main loop's interior path once per K step "
            "(loop_executed of the code object)",
            "8-wave ping-pong (gemm_pingpong): one group's MFMA cluster runs beside the other "
            "group's memory cluster, so the matrix core, LDS, vL1D and L2 overlap",
            "issue: a wave issues its MFMAs (holding the matrix core their passes x 4 cycles) "
            "and its other instructions one per 4-clock issue slot, in order",
            "vmem/l2 count the vector-memory bytes of the loop; direct-to-LDS loads count in "
            "lds too; LDS bank conflicts are not modelled",
        ]
        if t.name == "gfx950":
            assumptions.append("gfx950's LDS and vL1D bytes per clock are taken as CDNA3's "
                               "(the profiler configs list the same 32 LDS banks); the CDNA4 "
                               "white paper's wider LDS reads are not sourced here")
    else:
        rep, loops = _hopper_loops(kernel, t, consts)
        # K steps an iteration of the consumers' loops covers (more than one where the
        # loop is unrolled, as promote_in_flight's runs): its products over a step's
        steps = round(sum(2 * m_ * n_ * k_ for _, shapes, _, _ in loops
                          for m_, n_, k_, _ in shapes) / (2 * bm * bn * bk)) or 1
        # those steps' TMA copies into shared memory
        cycles, detail = _hopper_cycles(t, dtype, loops,
                                        (bm + bn) * bk * _itemsize(dtype) * steps,
                                        used, pingpong=bool(consts.get("PINGPONG")))
        detail["k_steps_per_iteration"] = steps
        tiles = consts["TM"] * consts["TN"]
        slots = persistent or t.num_cus
        iters = math.ceil(tiles / slots) * math.ceil(math.ceil(k / bk) / steps)
        assumptions += [
            "one workgroup per SM (persistent, grid = min(tiles, SMs)); the busiest walks "
            "ceil(tiles / grid) blocks",
            "wgmma reads both operands from shared memory through its 128 B/clk banks, each "
            "consumer warpgroup its own A and all of B; the producer's TMA fills count too",
            "issue: each consumer warpgroup puts one warp on every SM sub-partition; a warp "
            "issues its loop's SASS one instruction per clock (the loop's shortest path: an "
            "interior iteration); the producer warp's loop is not counted",
            "tensor FLOPs per SM per clock: back-to-back wgmma as measured on the chip "
            "(wgmma_flops_per_clk), else the published dense peak / (SMs x clock)",
            WAITS,
        ]
    dram_bytes = _dram_bytes(t, m, n, k, bm, bn, bk, dtype, out, consts["MAP"], persistent)
    hbm = dict(t.hbm_bytes_per_s_by_chip).get(chip, t.hbm_bytes_per_s)
    used["hbm_bytes_per_s"] = (hbm, f"targets/{t.name}: {chip} data sheet peak memory bandwidth")
    cycles["dram"] = dram_bytes / hbm * run_clock / iters
    bound = max(cycles, key=cycles.get)
    time_s = cycles[bound] * iters / run_clock
    flops = 2.0 * m * n * k
    # the matrix work of one iteration on one CU: every resident block's K step
    per_iter = 2.0 * bm * bn * bk * (wgs if t.family == "cdna" else steps)
    return {
        "kernel": kernel_name, "target": t.name, "chip": chip, "shape": [m, n, k],
        "dtype": dtype, "out_dtype": out,
        "modeled_tflops": flops / time_s / 1e12,
        "bound": bound,
        # resources within 5% of the bound one: the model cannot tell them apart
        "near_bound": [r for r, c in cycles.items() if r != bound and c >= 0.95 * cycles[bound]],
        "cycles": {r: round(c, 1) for r, c in cycles.items()},
        "time_s": time_s,
        "iterations_per_cu": iters,
        "matrix_flops_per_clk": per_iter / cycles["matrix"],
        "tiles": tiles, "grid": list(grid), "block": [bm, bn, bk],
        "dram_bytes": dram_bytes,
        "matrix_peak_tflops": matrix_peak_flops(t, dtype, chip) / 1e12,
        "code_object": {**detail, "registers": rep.get("unified_vgpr", rep.get("registers")),
                        "lds_bytes": rep.get("lds_bytes", rep.get("smem_bytes")),
                        "loop_executed": rep.get("loop_executed")},
        "assumptions": assumptions,
        "constants": used,
    }


def _model_sm90(kernel_name, target, shape, dtype, plan, chip, causal=False) -> dict:
    """attention and the row kernels on Hopper (`model`'s docstring):

    - attention_fwd / attention_bwd, shape (B, Hq, Hkv, N, D): the consumer warpgroups'
      wgmma loop, an iteration a K/V block (forward) or a query block (the backward's main
      pass) of every consumer, as gemm_ws's (tensor cores, issue, shared memory) plus the
      special-function unit its exponentials take; the workgroups handed to the SMs as
      they free up; DRAM from the cache simulator (head-first order); the backward's
      passes before and after the main one streamed at the measured copy bandwidth.
    - row kernels, shape (rows, cols): streaming, so as a copy kernel of the launch's
      tensor bytes runs on the H200 (a fixed start and drain, and the bytes at the
      measured device-to-device copy bandwidth)."""
    t = targets.get(target)
    if t.name != "sm_90a":
        raise ValueError(f"{kernel_name} is modelled on sm_90a, not {t.name}; pick --target "
                         "sm_90a")
    chip = _chip(t, chip)
    shape = tuple(int(x) for x in shape)
    want = 2 if kernel_name in ROWS else 5
    if len(shape) != want or min(shape) < 1:
        raise ValueError(f"{kernel_name} takes --shape " + (
            "B Hq Hkv N D" if want == 5 else "ROWS COLS") + f", got {' '.join(map(str, shape))}")
    lp = plan(kernel_name, t.name, shape, dtype, causal=causal)
    used: dict = {}
    if kernel_name in ROWS:
        if not t.has_fact(f"copy_bytes_per_s/{chip}"):
            raise ValueError(f"the row kernels' model needs a copy bandwidth measured on the "
                             f"chip; {chip} has none (pick --chip H200)")
        time_s = _streamed(t, chip, lp.tensor_bytes, used)
        return {"kernel": kernel_name, "target": t.name, "chip": chip, "shape": list(shape),
                "dtype": dtype, "time_s": time_s, "bound": "dram",
                "dram_bytes": lp.tensor_bytes, "grid": list(lp.grid),
                "modeled_bytes_per_s": lp.tensor_bytes / time_s,
                "partial_sums": list(lp.partial_sums),
                "assumptions": ["streaming: every tensor of the launch read or written once, "
                                "as a copy kernel of as many bytes takes on the chip (its "
                                "fixed start and drain among back-to-back kernels, and the "
                                "bytes at the measured copy bandwidth)",
                                "instruction issue, barriers and latency beyond a copy's "
                                "are not counted"] + ([
                                    "fused: the walk's partial rows are written and read "
                                    "back (column_sum's bytes) in the one launch; its "
                                    "grid-wide barrier between the two is not counted"]
                                    if kernel_name.endswith("_fused") else []),
                "constants": used}
    b, hq, hkv, n, d = shape
    clock, run_clock = _clocks(t, chip, used)
    rep, loops = _hopper_loops(lp.kernel, t, {**lp.consts, "DT": dtype})
    # one producer warpgroup, the rest consumers; where a consumer has a loop of its own for
    # the masked blocks (the backward's causal walk), an interior iteration takes the other,
    # its cheapest
    consumers = rep["num_waves"] // 4 - 1
    loops = sorted(loops, key=lambda loop: loop[0])[:consumers]
    bwd = kernel_name == "attention_bwd"
    # an iteration's TMA copies: a K and a V block (forward); a Q and a dO block (backward)
    fills = 2 * (lp.bm if bwd else lp.bn) * d * _itemsize(dtype)
    cycles, detail = _hopper_cycles(t, dtype, loops, fills, used,
                                    pingpong=bool(lp.consts.get("PINGPONG")))
    # workgroups to the SMs as they free up (one resident an SM: registers), in launch order
    import heapq
    sms = [0] * t.num_cus
    for its in lp.iterations:
        heapq.heapreplace(sms, sms[0] + its)
    iters = max(sms)
    from .. import chiplet
    op = chiplet.Attention(b, hq, n, d, kv_heads=hkv, bq=lp.bm, bkv=lp.bn, dtype=dtype)
    dram_bytes = chiplet.simulate(op, chiplet.parse_mapping("head-first", op, t.name),
                                  t.name).hbm_bytes
    hbm = dict(t.hbm_bytes_per_s_by_chip).get(chip, t.hbm_bytes_per_s)
    used["hbm_bytes_per_s"] = (hbm, f"targets/{t.name}: {chip} data sheet peak memory bandwidth")
    cycles["dram"] = dram_bytes / hbm * run_clock / iters
    beside = {}
    if lp.reduce_bytes:              # one wave adds each dQ tile after the last has been read
        rate = _fact(t, f"tma_reduce_bytes_per_s/{_nearest_share(t, lp.reduce_share)}", used)
        beside["reduce"] = round(lp.reduce_bytes * t.num_cus / rate * run_clock, 1)
    bound = max(cycles, key=cycles.get)
    time_s = cycles[bound] * iters / run_clock
    flops = 4.0 * b * hq * n * n * d * (0.5 if causal else 1.0) * (2.5 if bwd else 1.0)
    if bwd:                          # the passes before and after: streaming, as copies
        time_s += _streamed(t, chip, lp.tensor_bytes, used, kernels=2)
    return {
        "kernel": kernel_name, "target": t.name, "chip": chip, "shape": list(shape),
        "causal": bool(causal), "dtype": dtype, "modeled_tflops": flops / time_s / 1e12,
        "bound": bound,
        "near_bound": [r for r, c in cycles.items() if r != bound and c >= 0.95 * cycles[bound]],
        "cycles": {r: round(c, 1) for r, c in cycles.items()}, "beside": beside,
        "time_s": time_s,
        "iterations_per_cu": iters, "tiles": len(lp.iterations), "grid": list(lp.grid),
        "block": [lp.bm, lp.bn, d], "dram_bytes": dram_bytes,
        "matrix_peak_tflops": matrix_peak_flops(t, dtype, chip) / 1e12,
        "code_object": {**detail, "registers": rep.get("registers"),
                        "lds_bytes": rep.get("smem_bytes")},
        "assumptions": [
            "the resources (tensor cores, issue, MUFU, shared memory, DRAM, waits) overlap "
            "completely: time = the busiest one's cycles per iteration x the busiest SM's "
            "iterations / clock",
            WAITS,
            f"the kernel runs at {run_clock / 1e9:.2f} GHz throughout ({chip}'s "
            + ("measured clock under a tensor-bound load"
               if t.has_fact(f"load_clock_hz/{chip}") else
               "peak clock: none measured under load") + "); per-clock rates are the "
            f"hardware's at {clock / 1e9:.2f} GHz",
            "an iteration is the wgmma loop's shortest path (no mask, no rescale of O); "
            "a workgroup's prologue, Q load and epilogue are not counted",
            "one workgroup per SM; workgroups go to SMs in launch order as they free up",
            "FLOP/s count 4 B Hq N^2 D (halved for causal), 2.5 times that for the backward",
        ] + ([
            "backward: its main pass's DRAM is the forward's order's (K and V once, Q and "
            "dO streamed); dQ's additions into its f32 sum at the rate one wave adding tile "
            "after tile by the TMA unit reaches (measured) are shown beside the resources, "
            "not as one: adding into rows of its own per key block, the pass took the same "
            "time (docs/PERF.md run OA); the passes before (delta) and after (dQ's "
            "rounding) stream their tensors at the measured copy bandwidth"] if bwd else []),
        "constants": used,
    }


def _streamed(t, chip, nbytes, used, kernels=1) -> float:
    """Seconds `kernels` streaming kernels take to read and write `nbytes` in all: as copy
    kernels of as many bytes run among back-to-back kernels on the chip — a fixed start and
    drain each (where measured) and the bytes at the measured copy bandwidth."""
    fixed = _fact(t, f"kernel_fixed_s/{chip}", used) \
        if t.has_fact(f"kernel_fixed_s/{chip}") else 0.0
    return kernels * fixed + nbytes / _fact(t, f"copy_bytes_per_s/{chip}", used)


def _dram_bytes(t, m, n, k, bm, bn, bk, dtype, out, spec, persistent) -> int:
    """HBM bytes of the launch: the cache simulator replaying the launch's mapping."""
    from .. import chiplet
    tm, tn = math.ceil(m / bm), math.ceil(n / bn)
    op = chiplet.Gemm(tm * bm, tn * bn, k, bm=bm, bn=bn, bk=bk, dtype=dtype, out_dtype=out)
    mapping = chiplet.parse_mapping(spec, op, t.name)
    return chiplet.simulate(op, mapping, t.name, persistent=persistent).hbm_bytes


def format_table(res: dict) -> str:
    """The model as a short table: the resources per iteration and CU, the bound one marked."""
    if "cycles" not in res:                                     # a streaming row kernel
        return "\n".join([
            f"{res['kernel']} on {res['target']} ({res['chip']}), {res['dtype']}, rows x cols "
            f"= {' x '.join(map(str, res['shape']))}",
            f"modeled {res['time_s'] * 1e6:.1f} us, bound by dram: "
            f"{res['dram_bytes'] / 1e6:.1f} MB at {res['modeled_bytes_per_s'] / 1e12:.2f} TB/s",
            "assumptions:", *[f"  - {a}" for a in res["assumptions"]], "constants:",
            *[f"  {name} = {v:g}  ({src})" for name, (v, src) in res["constants"].items()]])
    what = ("B Hq Hkv N D = " + " ".join(map(str, res["shape"]))
            + (" causal" if res.get("causal") else "")) if "causal" in res else \
        f"-> {res['out_dtype']}, M N K = {' '.join(map(str, res['shape']))}"
    lines = [f"{res['kernel']} on {res['target']} ({res['chip']}), {res['dtype']} {what}",
             f"modeled {res['modeled_tflops']:.0f} TFLOP/s ({res['time_s'] * 1e3:.3f} ms), "
             f"bound by {res['bound']}"
             + (f" (within 5%: {', '.join(res['near_bound'])})" if res["near_bound"] else "")
             + f"; matrix peak {res['matrix_peak_tflops']:.0f}",
             f"{'resource':10s} {'cycles/iteration/CU':>20s}"]
    for r, c in res["cycles"].items():
        lines.append(f"{r:10s} {c:20.1f}{'  <- bound' if r == res['bound'] else ''}")
    for r, c in res.get("beside", {}).items():
        lines.append(f"{r:10s} {c:20.1f}  (beside the resources, not a bound)")
    lines.append(f"iterations on the busiest CU: {res['iterations_per_cu']}; tiles "
                 f"{res['tiles']}, block {'x'.join(map(str, res['block']))}; DRAM "
                 f"{res['dram_bytes'] / 1e9:.3f} GB")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in res["assumptions"]]
    lines.append("constants:")
    lines += [f"  {name} = {v:g}  ({src})" for name, (v, src) in res["constants"].items()]
    return "\n".join(lines)

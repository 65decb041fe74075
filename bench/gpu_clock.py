"""The SM clock an H200 holds under a long dense GEMM: nvidia-smi samples the SM clock, the
power draw and the active throttle reasons every 50 ms while cuBLAS (F.linear) and the
library GEMM (pykittens.ops.linear: gemm_ws) run back to back for a few seconds each, bf16,
4096³ and 8192³. The performance model (pykittens/analysis/model.py) takes cuBLAS's median as the
clock of a kernel bound by the tensor cores (targets/sm90a.py, load_clock_hz).

Then the tensor cores' rate per clock with nothing else to do: `wgmma_loop`, one workgroup
an SM, two warpgroups issuing bf16 wgmma m64n256k16 back to back (A from registers, B from
shared memory, one group in flight behind the one issuing), no memory traffic in the loop;
its FLOP/s over the clock sampled meanwhile and the 132 SMs is the dense bf16 FLOPs an SM
does per clock (targets/sm90a.py, wgmma_flops_per_clk); the other forms the library issues,
and attention's with one warpgroup issuing alone (WGMMA_FORMS). And the TMA unit's
reductions into L2 (`tma_reduce_loop`: one wave an SM adding f32 tiles one after another, as
attention_bwd's dQ writer does), by how many workgroups add into the same tile
(targets/sm90a.py, tma_reduce_bytes_per_s). And what an arrive fenced for the async proxy
costs (`fence_loop`: a wgmma group, a tile stored, the fenced arrive; targets/sm90a.py,
async_fence_clk).

    PYTHONPATH=. python3 bench/gpu_clock.py          # on the GPU
    PYTHONPATH=. python3 bench/gpu_clock.py --latency   # only the wgmma latencies
    PYTHONPATH=. python3 bench/gpu_clock.py --fence     # only the fenced arrives

Prints one row per (shape, contender) and the idle clocks; writes $OUT/gpu_clock.json."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import torch

import pykittens as pk
import pykittens.ops as pko

SECONDS = 5.0
SKIP = 4                      # samples before the clock settles


def sample(fn, seconds=SECONDS) -> dict:
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
         "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t0, calls = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        calls += 20
    elapsed = time.time() - t0
    smi.terminate()
    rows = [line.split(", ") for line in smi.communicate()[0].splitlines() if line.strip()]
    rows = rows[SKIP:]
    clock = [float(r[0]) for r in rows]
    return {"clock_mhz_median": statistics.median(clock), "clock_mhz_min": min(clock),
            "clock_mhz_max": max(clock),
            "power_w_median": statistics.median(float(r[1]) for r in rows),
            "throttle_reasons": sorted({r[2] for r in rows}), "calls_per_s": calls / elapsed}


WGMMA_STEPS = 2048             # K steps of 64 per launch: about 3 ms at the tensor cores' rate
SMS = 132


@pk.kernel(num_waves=8)
def wgmma_loop(a: pk.gl["DT", 2], b: pk.gl["DT", 2], c: pk.gl[pk.f32, 2],
               DT: pk.const = None, N: pk.const = 256, A_SMEM: pk.const = 0,
               STEPS: pk.const = WGMMA_STEPS, IN_FLIGHT: pk.const = 1):
    """c[rows of this workgroup] = STEPS x (a @ b.T) by wgmma m64nN (N = 64, 128 or 256) a
    step (4 of K16 for bf16, 4 of K32 for fp8): each wave's 16 rows of a (16 x K, one
    128-byte row: K = 64 bf16 or 128 fp8) held in registers, or (A_SMEM=1) all 64 rows of
    a warpgroup read from shared memory; b (N x K) in shared memory. IN_FLIGHT=0: each
    step's group waited for before the next is issued (wgmma_latency)."""
    kt = 128 // pk.dtype_of(DT).bytes
    sb = pk.empty(pk.st((N, kt), DT, swizzle=8))
    pk.load(sb, b, (0, 0))
    if A_SMEM:                      # both warpgroups multiply the same 64 rows
        ta = pk.empty(pk.st((64, kt), DT, swizzle=8))
        pk.load(ta, a, (0, 0))
    pk.barrier()
    if not A_SMEM:
        ta = pk.load(pk.rt((16, kt), DT, role="a"), a, (16 * pk.wave_id(), 0))
    acc = pk.zeros(pk.rt((16, N), pk.f32, role="acc"))
    for _ in pk.range(STEPS):
        pk.mma_ABt(acc, ta, sb, in_flight=IN_FLIGHT)
    pk.mma_wait(acc)
    pk.store(c, acc, (128 * pk.program_id(0) + 16 * pk.wave_id(), 0))


# the wgmma forms the library kernels issue (gemm_ws: n256 from registers; attention: n128
# from shared memory and from registers; its backward also n64), bf16, and fp8's gemm form;
# (dtype, N, A in shared memory, warpgroups issuing): attention's forms also with one
# warpgroup issuing alone, as one consumer's products run while the other does its softmax
WGMMA_FORMS = (("bf16", 256, 0, 2), ("bf16", 128, 0, 2), ("bf16", 128, 1, 2),
               ("bf16", 64, 0, 2), ("bf16", 64, 1, 2), ("e4m3", 256, 0, 2),
               ("bf16", 128, 0, 1), ("bf16", 128, 1, 1), ("bf16", 256, 0, 1))


def _wgmma_operands(dtype: str, n: int):
    """wgmma_loop's a (128 x K), b (N x K) and c, K one 128-byte row of `dtype`."""
    kt = 128 // pk.dtype_of(dtype).bytes
    tdt = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[dtype]
    a = torch.randn(128, kt, device="cuda").to(tdt)
    b = torch.randn(n, kt, device="cuda").to(tdt)
    return a, b, torch.empty(128 * SMS, n, device="cuda", dtype=torch.float32)


def wgmma_rate(dtype: str = "bf16", n: int = 256, a_smem: int = 0,
               warpgroups: int = 2) -> dict:
    """wgmma_loop on every SM for a few seconds (`warpgroups` of them issuing, one
    workgroup an SM): its FLOP/s, clock and FLOPs an SM a clock."""
    kt = 128 // pk.dtype_of(dtype).bytes
    a, b, c = _wgmma_operands(dtype, n)
    form = f"m64n{n} {dtype}, A from {'shared memory' if a_smem else 'registers'}" + \
        ("" if warpgroups == 2 else f", {warpgroups} warpgroup{'s' * (warpgroups > 1)}")
    r = {"shape": form, "contender": "wgmma loop", "dtype": dtype, "n": n, "a_smem": a_smem,
         "warpgroups": warpgroups,
         **sample(lambda: pk.launch(wgmma_loop, a, b, c, grid=SMS, N=n, A_SMEM=a_smem,
                                    num_waves=4 * warpgroups))}
    flops = SMS * 4 * warpgroups * 16 * n * kt * 2 * WGMMA_STEPS   # waves of 16 rows
    r["tflops"] = flops * r["calls_per_s"] / 1e12
    r["flops_per_clk_per_sm"] = r["tflops"] * 1e12 / (r["clock_mhz_median"] * 1e6 * SMS)
    sheet = 4096 * (2 if dtype == "e4m3" else 1)
    print(f"wgmma loop {form}: {r['tflops']:.0f} TFLOP/s at a median SM clock of "
          f"{r['clock_mhz_median']:.0f} MHz ({r['power_w_median']:.0f} W): "
          f"{r['flops_per_clk_per_sm']:.0f} FLOPs an SM a clock (the data sheet's: {sheet})",
          flush=True)
    return r


# the forms whose latency is timed: (dtype, N, A in shared memory)
LATENCY_FORMS = (("bf16", 64, 0), ("bf16", 64, 1), ("bf16", 128, 0), ("bf16", 128, 1),
                 ("bf16", 256, 0), ("e4m3", 128, 1), ("e4m3", 256, 0))


def wgmma_latency(dtype: str = "bf16", n: int = 256, a_smem: int = 0) -> dict:
    """One warpgroup an SM issuing wgmma_loop's groups (4 wgmmas of one K step) and waiting
    for each before the next (IN_FLIGHT=0): clocks a group takes from its issue to its
    results, against the same loop with one group in flight (the tensor cores' rate).
    latency_clk = the waited group's clocks less the pipelined one's: what a wait for a
    group costs beyond its share of the tensor cores' time."""
    a, b, c = _wgmma_operands(dtype, n)
    form = f"m64n{n} {dtype}, A from {'shared memory' if a_smem else 'registers'}"
    r = {"shape": form, "contender": "wgmma latency", "dtype": dtype, "n": n,
         "a_smem": a_smem}
    for key, in_flight in (("waited", 0), ("pipelined", 1)):
        got = sample(lambda: pk.launch(wgmma_loop, a, b, c, grid=SMS, N=n, A_SMEM=a_smem,
                                       IN_FLIGHT=in_flight, num_waves=4), seconds=2.0)
        clk = got["clock_mhz_median"] * 1e6 / (got["calls_per_s"] * WGMMA_STEPS)
        r[key] = {**got, "clk_per_group": clk}
    r["latency_clk"] = r["waited"]["clk_per_group"] - r["pipelined"]["clk_per_group"]
    print(f"wgmma latency {form}: {r['waited']['clk_per_group']:.0f} clocks a group waited "
          f"for, {r['pipelined']['clk_per_group']:.0f} pipelined: {r['latency_clk']:.0f} more",
          flush=True)
    return r


TMA_REDUCE_STEPS = 4096        # 64 x 64 f32 tiles a workgroup adds: 64 MiB a launch over the SMs


@pk.kernel(num_waves=4)
def tma_reduce_loop(c: pk.gl[pk.f32, 2], SHARE: pk.const = 1,
                    STEPS: pk.const = TMA_REDUCE_STEPS, IN_FLIGHT: pk.const = 0):
    """STEPS times, c[64 rows] += a 64 x 64 f32 tile of ones in shared memory, by the TMA
    unit's reduction at L2, one wave issuing each after the last has read the tile (as
    attention_bwd's dQ writer does: pk.tma_store(add=True)), or with IN_FLIGHT more issued
    before it waits; SHARE consecutive workgroups add into the same 64 rows (attention_bwd:
    the key blocks of a head into one dQ sum)."""
    st = pk.empty(pk.st((64, 64), pk.f32))
    pk.store(st, pk.full(pk.rt((16, 64), pk.f32), 1.0), (16 * pk.wave_id(), 0))
    pk.barrier()
    with pk.if_(pk.wave_id() == 0):
        for _ in pk.range(STEPS):
            pk.tma_store(c, st, (64 * (pk.program_id(0) // SHARE), 0), add=True,
                         wait=not IN_FLIGHT)
            if IN_FLIGHT:
                pk.tma_store_wait(IN_FLIGHT)
        if IN_FLIGHT:
            pk.tma_store_wait()


TMA_REDUCE_SHARES = (1, 8, 32, 132)      # what targets/sm90a.py takes (run NC)


def tma_reduce_rate(share: int = 1, in_flight: int = 0) -> dict:
    """tma_reduce_loop, one workgroup an SM, for a few seconds: the bytes it adds a second,
    and per SM and clock."""
    c = torch.zeros(64 * -(-SMS // share), 64, device="cuda", dtype=torch.float32)
    form = f"TMA reduce-add, 64 x 64 f32 tiles, {share} workgroup{'s' * (share > 1)} a tile"
    form += f", {in_flight} more in flight" if in_flight else ""
    r = {"shape": form, "contender": "tma reduce loop", "share": share, "in_flight": in_flight,
         **sample(lambda: pk.launch(tma_reduce_loop, c, grid=SMS, SHARE=share,
                                    IN_FLIGHT=in_flight))}
    nbytes = SMS * TMA_REDUCE_STEPS * 64 * 64 * 4
    r["bytes_per_s"] = nbytes * r["calls_per_s"]
    r["bytes_per_clk_per_sm"] = r["bytes_per_s"] / (r["clock_mhz_median"] * 1e6 * SMS)
    print(f"{form}: {r['bytes_per_s'] / 1e12:.2f} TB/s at a median SM clock of "
          f"{r['clock_mhz_median']:.0f} MHz: {r['bytes_per_clk_per_sm']:.1f} bytes an SM a "
          "clock", flush=True)
    return r


FENCE_STEPS = 2048


@pk.kernel(num_waves=4)
def fence_loop(a: pk.gl[pk.bf16, 2], b: pk.gl[pk.bf16, 2], c: pk.gl[pk.f32, 2],
               STEPS: pk.const = FENCE_STEPS, MMA: pk.const = 1, IN_FLIGHT: pk.const = 1,
               STORE: pk.const = 1, ARRIVE: pk.const = 1):
    """One warpgroup, STEPS times: a wgmma group (m64n128 bf16, A from registers; MMA),
    one left in flight (IN_FLIGHT) or waited for; then each wave stores a 16 x 64 bf16
    tile of registers into shared memory (STORE) and arrives on an mbarrier (ARRIVE): the
    arrive that hands a tile written by ordinary stores to the async proxy, so the code
    generator puts `fence.proxy.async` before it (SASS: MEMBAR.ALL.CTA, FENCE.VIEW.ASYNC.S),
    as attention_bwd's consumers do twice a step (dS for the other group, dQ for its
    writer). What the fence costs, and whether it waits for the group in flight."""
    sb = pk.empty(pk.st((128, 64), pk.bf16, swizzle=8))
    pk.load(sb, b, (0, 0))
    st = pk.empty(pk.st((64, 64), pk.bf16, swizzle=8))
    bar = pk.mbarrier(4)
    pk.barrier()
    ta = pk.load(pk.rt((16, 64), pk.bf16, role="a"), a, (16 * pk.wave_id(), 0))
    acc = pk.zeros(pk.rt((16, 128), pk.f32, role="acc"))
    x = pk.zeros(pk.rt((16, 64), pk.f32))
    for _ in pk.range(STEPS):
        if MMA:
            pk.mma_ABt(acc, ta, sb, in_flight=IN_FLIGHT)
        if STORE:
            x += 1.0                      # a new tile each step: no store is loop-invariant
            pk.store(st, x.cast(pk.bf16), (16 * pk.wave_id(), 0))
        if ARRIVE:
            pk.arrive(bar)
    pk.mma_wait(acc)
    pk.store(c, acc, (16 * pk.wave_id() + 64 * pk.program_id(0), 0))


# (name, MMA, IN_FLIGHT, STORE, ARRIVE); the fence comes only with wgmma in the kernel
FENCE_FORMS = (("group in flight", 1, 1, 0, 0), ("group waited", 1, 0, 0, 0),
               ("in flight, store", 1, 1, 1, 0), ("in flight, store, fenced arrive", 1, 1, 1, 1),
               ("waited, store", 1, 0, 1, 0), ("waited, store, fenced arrive", 1, 0, 1, 1))


def fence_cost() -> list[dict]:
    """fence_loop's forms on every SM (one workgroup an SM): clocks a step each. A fenced
    arrive costs its form less the same without it; if it waits for the group in flight,
    "in flight, store, fenced arrive" takes as long as "waited, store, fenced arrive"."""
    a = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    b = torch.randn(128, 64, device="cuda").to(torch.bfloat16)
    c = torch.zeros(64 * SMS, 128, device="cuda", dtype=torch.float32)
    out = []
    for name, mma, in_flight, store, arrive in FENCE_FORMS:
        got = sample(lambda: pk.launch(fence_loop, a, b, c, grid=SMS, MMA=mma,
                                       IN_FLIGHT=in_flight, STORE=store, ARRIVE=arrive),
                     seconds=2.0)
        clk = got["clock_mhz_median"] * 1e6 / (got["calls_per_s"] * FENCE_STEPS)
        out.append({"shape": name, "contender": "fence loop", "mma": mma,
                    "in_flight": in_flight, "store": store, "arrive": arrive, **got,
                    "clk_per_step": clk})
        print(f"fence loop, {name}: {clk:.0f} clocks a step", flush=True)
    return out


def main() -> int:
    if "--fence" in sys.argv:                 # only the fenced arrives
        with open(os.path.join(os.environ.get("OUT", "."), "gpu_clock_fence.json"), "w") as f:
            json.dump({"runs": fence_cost()}, f, indent=1)
        return 0
    if "--latency" in sys.argv:               # only the wgmma latencies
        out = [wgmma_latency(*form) for form in LATENCY_FORMS]
        with open(os.path.join(os.environ.get("OUT", "."), "gpu_clock_latency.json"), "w") as f:
            json.dump({"runs": out}, f, indent=1)
        return 0
    out = []
    for m in (4096, 8192):
        a, b = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for name, fn in (("cuBLAS", lambda: torch.nn.functional.linear(a, b)),
                         ("pykittens", lambda: pko.linear(a, b))):
            r = {"shape": m, "contender": name, **sample(fn)}
            r["tflops"] = 2 * m ** 3 * r["calls_per_s"] / 1e12
            out.append(r)
            print(f"{m}³ bf16 {name:10s} SM clock median {r['clock_mhz_median']:.0f} MHz "
                  f"(min {r['clock_mhz_min']:.0f}, max {r['clock_mhz_max']:.0f}), "
                  f"{r['power_w_median']:.0f} W, throttle {','.join(r['throttle_reasons'])}, "
                  f"{r['tflops']:.0f} TFLOP/s (host loop)", flush=True)
    out += [wgmma_rate(*form) for form in WGMMA_FORMS]
    out += [wgmma_latency(*form) for form in LATENCY_FORMS]
    out += [tma_reduce_rate(share) for share in TMA_REDUCE_SHARES]
    out += fence_cost()
    idle = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.limit",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout
    print(f"idle: {idle.strip()}  (SM clock, max SM clock, power limit)")
    with open(os.path.join(os.environ.get("OUT", "."), "gpu_clock.json"), "w") as f:
        json.dump({"runs": out, "idle": idle.strip()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

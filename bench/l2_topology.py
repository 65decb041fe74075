"""Which L2 partition each SM of the H200 sits beside, and which SM each workgroup of a
one-per-SM launch lands on: the facts the cache simulator's Hopper model places workgroups
with (pykittens/chiplet/sim.py, targets/sm90a.py).

One launch of 132 workgroups, one per SM (each asks for 200 KB of shared memory), one
thread each, taking turns (a counter in global memory):
- workgroup 0 first reads every line of every workgroup's region once (so each line sits
  in L2: at its home partition and, where the L2 keeps copies near the SM that asked, in
  workgroup 0's partition too);
- then each workgroup in turn times its own region's lines one at a time (ld.global.cg,
  the loaded value stored to shared memory before the clock is read again, so the clock
  waits for it): a line found in the SM's own partition returns sooner than one fetched
  from the other partition.
An SM beside workgroup 0's partition finds every line near (if the L2 keeps copies) or
the half homed there; an SM beside the other partition finds near only the lines homed
there. So the share of slow lines tells the two sides apart. Each workgroup also records
its SM (%smid). The launch runs ROUNDS times: the SM of each workgroup and each SM's side
should repeat.

    PYTHONPATH=. python3 bench/l2_topology.py     # on the H200; $OUT/l2_topology.json

Prints the latency histogram, each side's SMs and the workgroup -> SM map."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

LINES = 64                 # lines a workgroup times
ROUNDS = 3
SMEM = 200 * 1024          # one workgroup per SM
BUFFER_LINES = 1 << 21     # 256 MiB of 128-byte lines to place them in at random

SOURCE = r"""
extern "C" __global__ void probe(const unsigned* __restrict__ buf, const long long* line,
                                 int lines, volatile unsigned* turn, long long* lat,
                                 int* smid, unsigned* sink) {
    extern __shared__ unsigned keep[];
    if (threadIdx.x != 0) return;
    int b = blockIdx.x;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    smid[b] = (int)sm;
    if (b == 0) {                       // every region's lines into L2, from one SM
        unsigned s = 0;
        for (int i = 0; i < gridDim.x * lines; i++) s += __ldcg(buf + line[i] * 32);
        sink[0] = s;
        __threadfence();
        *turn = 1;
    }
    while (*turn != (unsigned)(b + 1)) { __nanosleep(500); }   // light on L2 meanwhile
    __threadfence();
    for (int i = 0; i < lines; i++) {
        const unsigned* p = buf + line[b * lines + i] * 32;
        keep[lines + i] = (unsigned)(size_t)p;   // the clock below waits for the address
        long long t0 = clock64();
        unsigned v = __ldcg(p);
        keep[i] = v;                    // the clock below waits for the load
        long long t1 = clock64();
        lat[b * lines + i] = t1 - t0;
    }
    __threadfence();
    *turn = b + 2;
}
"""


def run_once(cp, kernel, sms):
    rng = np.random.default_rng(len(sys.argv))
    line = rng.choice(BUFFER_LINES, size=sms * LINES, replace=False).astype(np.int64)
    buf = cp.zeros(BUFFER_LINES * 32, dtype=cp.uint32)
    d_line = cp.asarray(line)
    turn = cp.zeros(1, dtype=cp.uint32)
    lat = cp.zeros(sms * LINES, dtype=cp.int64)
    smid = cp.full(sms, -1, dtype=cp.int32)
    sink = cp.zeros(1, dtype=cp.uint32)
    kernel((sms,), (32,), (buf, d_line, np.int32(LINES), turn, lat, smid, sink),
           shared_mem=SMEM)
    cp.cuda.runtime.deviceSynchronize()
    return lat.get().reshape(sms, LINES), smid.get()


def sides(lat: np.ndarray) -> tuple[float, np.ndarray]:
    """(the latency between the two modes, each workgroup's share of slow lines)."""
    flat = np.sort(lat.ravel())
    lo, hi = np.percentile(flat, 5), np.percentile(flat, 95)
    # the threshold: the widest gap between consecutive latencies in the middle 90%
    mid = flat[(flat >= lo) & (flat <= hi)]
    gap = np.argmax(np.diff(mid))
    cut = (mid[gap] + mid[gap + 1]) / 2
    return cut, (lat > cut).mean(axis=1)


def main() -> int:
    import cupy as cp
    sms = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    kernel = cp.RawKernel(SOURCE, "probe")
    kernel.max_dynamic_shared_size_bytes = SMEM
    rounds = []
    for r in range(ROUNDS):
        lat, smid = run_once(cp, kernel, sms)
        cut, slow = sides(lat)
        rounds.append({"lat": lat.tolist(), "smid": smid.tolist(), "cut": float(cut),
                       "slow_share": slow.tolist()})
        hist, edges = np.histogram(lat, bins=16)
        print(f"round {r}: latency cycles, histogram "
              + ", ".join(f"{edges[i]:.0f}:{hist[i]}" for i in range(len(hist))))
        print(f"round {r}: threshold {cut:.0f} cycles; slow share per workgroup: "
              + " ".join(f"{s:.2f}" for s in slow))
    first = rounds[0]
    same_sm = all(r["smid"] == first["smid"] for r in rounds)
    near0 = [np.array(r["slow_share"]) < 0.25 for r in rounds]
    by_sm = [{s: bool(n) for s, n in zip(r["smid"], near)} for r, near in zip(rounds, near0)]
    same_side = all(b == by_sm[0] for b in by_sm)
    print(f"workgroup -> SM the same every round: {same_sm}; each SM's side the same: "
          f"{same_side}")
    print("workgroup -> SM:", first["smid"])
    side = [int(not by_sm[0][s]) for s in range(sms)]
    print("SM -> side (0: workgroup 0's):", side)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "l2_topology.json"), "w") as f:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "lines": LINES, "rounds": rounds, "sm_side": side,
                       "same_sm_every_round": same_sm, "same_side_every_round": same_side},
                      f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the shape of a streaming read meets DRAM: one weight matrix B (N x K bf16, K
contiguous, as a linear layer's) read once by TMA copies into a ring of shared tiles, with
nothing else to do, under the geometries a split-K GEMM can give its workgroups.

Workgroup w reads rows ROWS x (w // SPLIT) .. + ROWS of B over the (w % SPLIT)-th of SPLIT
equal parts of K, BOXES copies of ROWS x 64 a ring stage, STAGES stages: ROWS = 128, SPLIT =
4 is gemm_sk's 128-wide blocks at 128 x 4096 x 14336 (about four workgroups a block); ROWS =
64, SPLIT = 2 the blocks cuBLAS's split kernel takes there (docs/PERF.md runs TM, UC).
GB/s of B against a device-to-device copy of as many bytes in the same run; with A, each
stage also copies the same K columns of a 128-row A (every workgroup the same rows).

    PYTHONPATH=.:bench python3 bench/dram_stream.py          # on the GPU
    PYKITTENS_CACHE=$PWD/.pkc_ds PYTHONPATH=.:bench python3 bench/dram_stream.py --prebuild

Writes $OUT/dram_stream.json and prints a table."""
from __future__ import annotations

import json
import os
import sys

import pykittens as pk

N, K = 4096, 14336                  # the Llama-3 8B down projection's weight (N x K)
# (ROWS, SPLIT, STAGES, BOXES, A, LATE): rows of a workgroup's slab, parts of K, ring stages,
# copies of B a stage, whether each stage also copies A's 128 rows (gemm_sk's other operand
# at M = 128), and whether a stage is released a step late (as a GEMM's consumers do); every
# form has N / ROWS x SPLIT = 128 workgroups
FORMS = ((128, 4, 4, 1, 0, 0), (128, 4, 6, 1, 0, 0), (128, 4, 3, 2, 0, 0),
         (64, 2, 4, 1, 0, 0), (64, 2, 8, 1, 0, 0), (32, 1, 8, 1, 0, 0), (32, 1, 8, 2, 0, 0),
         (128, 4, 4, 1, 1, 0), (128, 4, 6, 1, 1, 0), (64, 2, 8, 1, 1, 0),
         (128, 4, 4, 1, 1, 1), (128, 4, 5, 1, 1, 1), (128, 4, 6, 1, 1, 1),
         (64, 2, 8, 1, 1, 1))


@pk.kernel(num_waves=8)
def stream_reads(b: pk.gl[pk.bf16, 2], a: pk.gl[pk.bf16, 2], out: pk.gl[pk.f32, 2],
                 K: pk.const = K, ROWS: pk.const = 128, SPLIT: pk.const = 4,
                 STAGES: pk.const = 4, BOXES: pk.const = 1, A: pk.const = 0,
                 LATE: pk.const = 0):
    """out[16 rows a wave of workgroup w] = the sum over its steps of the first 16 x 64
    elements of each stage's first copy (so each copy is waited for and read); b's slab
    read in ROWS x 64 copies, BOXES a stage (module docstring). A=1: each stage also copies
    the same K columns of `a` (128 rows, every workgroup the same: a skinny GEMM's
    activations, from L2 after the first). LATE=1: a stage is released only once the next
    one has arrived (as a GEMM consumer releases a stage when the product that read it
    retires, one step behind)."""
    steps = K // (64 * BOXES * SPLIT)
    r0 = ROWS * (pk.program_id(0) // SPLIT)
    k0 = (pk.program_id(0) % SPLIT) * (K // SPLIT)
    tiles = {"b": [pk.st((ROWS, 64), pk.bf16, swizzle=8)] * BOXES}
    if A:
        tiles["a"] = [pk.st((128, 64), pk.bf16, swizzle=8)] * BOXES
    ring = pk.Ring(STAGES, fill=BOXES * (1 + A), drain=4, **tiles)
    with pk.role(0, 4, regs=24):
        with pk.if_(pk.wave_id() == 0):
            for s in pk.range(steps):
                st = ring.acquire(s)
                for j in pk.static_range(BOXES):
                    pk.tma_load(st.b[j], b, (r0, k0 + (s * BOXES + j) * 64), st.full)
                    if A:
                        pk.tma_load(st.a[j], a, (0, k0 + (s * BOXES + j) * 64), st.full)
    with pk.role(4, 4, regs=240):
        w = pk.wave_id() % 4
        total = pk.zeros(pk.rt((16, 64), pk.f32))
        for s in pk.range(steps):
            st = ring.wait(s)
            total += pk.load(pk.rt((16, 64), pk.bf16), st.b[0],
                             (16 * (w % (ROWS // 16)), 0)).cast(pk.f32)
            if LATE:
                with pk.if_(s >= 1):
                    ring.release(s - 1)
            else:
                ring.release(s)
        if LATE:
            ring.release(steps - 1)
        pk.store(out, total, (64 * pk.program_id(0) + 16 * w, 0))


def _consts(rows, split, stages, boxes, a, late) -> dict:
    return {"K": K, "ROWS": rows, "SPLIT": split, "STAGES": stages, "BOXES": boxes, "A": a,
            "LATE": late}


def grid(rows, split) -> int:
    return N // rows * split


def prebuild() -> int:
    from prebuild import ptx                     # bench/, this script's directory
    return ptx((stream_reads, _consts(*form)) for form in FORMS)


def main() -> int:
    if "--prebuild" in sys.argv:
        return prebuild()
    import torch

    from pykittens.runtime.launch import launch
    from pykittens.tune import graph_time
    b = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    a = torch.randn(128, K, device="cuda").to(torch.bfloat16)
    out = torch.empty(64 * N, 64, device="cuda", dtype=torch.float32)
    copy_to = torch.empty_like(b)
    nbytes = b.numel() * b.element_size()
    rows = []
    for rnd in range(3):                  # interleaved rounds: medians below
        t = graph_time(lambda: copy_to.copy_(b))
        rows.append({"form": "copy", "round": rnd, "s": t, "gb_s": 2 * nbytes / t / 1e9})
        for form in FORMS:
            g = grid(form[0], form[1])
            t = graph_time(lambda: launch(stream_reads, b, a, out, grid=g, **_consts(*form)))
            rows.append({"form": list(form), "round": rnd, "s": t, "gb_s": nbytes / t / 1e9})
            print(f"round {rnd}, {form}: {nbytes / t / 1e9:.0f} GB/s", flush=True)
    med = {}
    for r in rows:
        med.setdefault(str(r["form"]), []).append(r["gb_s"])
    copy = sorted(med["copy"])[1]
    print(f"{'rows':>5} {'split':>5} {'stages':>6} {'boxes':>5} {'A':>2} {'late':>4} "
          f"{'bytes a row in flight':>21} {'GB/s of B':>9} {'of copy':>7}")
    table = []
    for form in FORMS:
        gbs = sorted(med[str(list(form))])[1]
        r, sp, st, bx, with_a, late = form
        table.append({"rows": r, "split": sp, "stages": st, "boxes": bx, "a": with_a,
                      "late": late, "gb_s": gbs, "of_copy": gbs / copy})
        print(f"{r:5d} {sp:5d} {st:6d} {bx:5d} {with_a:2d} {late:4d} {st * bx * 128:21d} "
              f"{gbs:9.0f} {gbs / copy:7.3f}")
    print(f"device-to-device copy (read + write): {copy:.0f} GB/s")
    with open(os.path.join(os.environ.get("OUT", "."), "dram_stream.json"), "w") as f:
        json.dump({"n": N, "k": K, "copy_gb_s": copy, "table": table, "rounds": rows}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

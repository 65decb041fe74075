"""Tensor-parallel linear layers across the GPUs of one host (two H200s): pykittens'
fused all-gather + GEMM and GEMM + reduce-scatter against torch's sequential baseline
(NCCL collective, then cuBLAS) and torch's fused symmetric-memory ops, in one run.

    PYTHONPATH=. python3 bench/comm.py            # every GPU of the host, one process each
    PYTHONPATH=. python3 bench/comm.py correctness
    PYKITTENS_CACHE=$PWD/.pkc_comm PYTHONPATH=. python3 bench/comm.py --prebuild   # no GPU

Shapes: Llama-3-70B (hidden 8192, MLP 28672, 64 query / 8 KV heads of 128) split over the
ranks (TP = number of GPUs), M = 4096, 8192, 16384 tokens: the MLP's gate+up projection
and the attention QKV projection as all-gather + GEMM (sequence-parallel input), the MLP's
down and the attention output projection as GEMM + reduce-scatter. Each time is the
slowest rank's mean over CUDA-event-timed iterations. Details go to $OUT/comm.json when
OUT is set; a table is printed last; exit status 1 when a result disagrees with torch.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# NVLink multicast stays off on shared hosts (see the machine's notes)
for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
             ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)

HIDDEN, MLP, HEADS, KV, HD = 8192, 28672, 64, 8, 128
TOKENS = (4096, 8192, 16384)


def cases(world):
    """(name, kind, rows of x on this rank, K, N of this rank's weight) per shape."""
    out = []
    for m in TOKENS:
        out += [(f"mlp.gate_up M={m}", "ag", m // world, HIDDEN, 2 * MLP // world),
                (f"attn.qkv M={m}", "ag", m // world, HIDDEN, (HEADS + 2 * KV) * HD // world),
                (f"mlp.down M={m}", "rs", m, MLP // world, HIDDEN),
                (f"attn.o M={m}", "rs", m, HEADS * HD // world, HIDDEN)]
    return out


def _time(fn, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    h = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - h) / iters * 1e3
    b.record()
    torch.cuda.synchronize()
    t = torch.tensor([a.elapsed_time(b) / iters, host], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    _time.host = float(t[1])              # host ms per call (the slowest rank's)
    return float(t[0])


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _torch_fused(kind, x, w, group):
    """torch's fused symmetric-memory op for the case, or None where this torch lacks it."""
    try:
        import torch.distributed._symmetric_memory as symm
        name = group.group_name
        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(name)
        if kind == "ag":
            op = torch.ops.symm_mem.fused_all_gather_matmul
            return lambda: op(x, [w.t()], 0, name)[1][0]
        op = torch.ops.symm_mem.fused_matmul_reduce_scatter
        return lambda: op(x, w.t(), "sum", 0, name)
    except Exception as e:                              # noqa: BLE001 (reported, not fatal)
        return repr(e)[:120]


def _worker(rank, world, port, steps, out_path):
    import pykittens.ops as pko
    import pykittens.ops.comm as pkc
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    rows, ok = [], True
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).bfloat16()

    if "correctness" in steps:
        # small and ragged-free shapes, three calls in a row (the flags' epochs), and the
        # gradients of both ops against torch's collectives
        for kind, ms, k, n in (("ag", 256, 512, 512), ("ag", 1024, 4096, 1024),
                               ("rs", 512, 768, 256), ("rs", 2048, 1024, 2048)):
            x, w = rand(ms, k), rand(n, k, scale=k ** -0.5)
            f = pkc.all_gather_linear if kind == "ag" else pkc.linear_reduce_scatter
            exact = f(x.double(), w.double(), group, fused=False)      # float64 reference
            torch_err = _rel(f(x, w, group, fused=False), exact)
            errs = [_rel(f(x, w, group, fused=True), exact) for _ in range(3)]
            good = max(errs) < 2e-2
            ok &= good
            rows.append({"step": "correctness", "case": f"{kind} {ms}x{k}x{n} x3 calls",
                         "rel_err": max(errs), "torch_rel_err": torch_err, "ok": good})
        for kind in ("ag", "rs"):
            ms, k, n = (256, 512, 512) if kind == "ag" else (512, 512, 256)
            x, w = rand(ms, k).requires_grad_(), rand(n, k, scale=k ** -0.5).requires_grad_()
            f = pkc.all_gather_linear if kind == "ag" else pkc.linear_reduce_scatter
            g = rand(*f(x, w, group, fused=False).shape)
            x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
            exact = torch.autograd.grad(f(x64, w64, group, fused=False), (x64, w64),
                                        g.double())
            got = torch.autograd.grad(f(x, w, group), (x, w), g)
            err = max(_rel(a, b) for a, b in zip(got, exact))
            good = err < 2e-2
            ok &= good
            rows.append({"step": "correctness", "case": f"{kind} gradients", "rel_err": err,
                         "ok": good})

    if "performance" in steps:
        for name, kind, ms, k, n in cases(world):
            x, w = rand(ms, k), rand(n, k, scale=k ** -0.5)
            linear = torch.nn.functional.linear
            if kind == "ag":
                full = torch.empty(world * ms, k, device="cuda", dtype=x.dtype)
                gemm_in, flops = full, 2 * world * ms * k * n

                def coll():
                    dist.all_gather_into_tensor(full, x, group=group)

                def seq():
                    coll()
                    return linear(full, w)
            else:
                part = torch.empty(ms // world, n, device="cuda", dtype=x.dtype)
                y = linear(x, w)
                gemm_in, flops = x, 2 * ms * k * n

                def coll():
                    dist.reduce_scatter_tensor(part, y, group=group)

                def seq():
                    dist.reduce_scatter_tensor(part, linear(x, w), group=group)
                    return part
            op = pkc.all_gather_linear if kind == "ag" else pkc.linear_reduce_scatter
            pk_fused = (lambda: op(x, w, group, fused=True))
            gemm = (lambda: linear(gemm_in, w))
            pk_gemm = (lambda: pko.linear(gemm_in, w))
            err = _rel(pk_fused(), seq())
            row = {"step": "performance", "case": name, "kind": kind, "x": [ms, k],
                   "w": [n, k], "rel_err": err, "ok": err < 2e-2}
            ok &= row["ok"]
            row["ms_seq"] = _time(seq)
            row["ms_pykittens"] = _time(pk_fused)
            row["host_ms_pykittens"] = _time.host
            row["ms_gemm_alone"] = _time(gemm)
            row["ms_pykittens_gemm_alone"] = _time(pk_gemm)
            row["ms_collective_alone"] = _time(coll)
            tf = _torch_fused(kind, x, w, group)
            if callable(tf):
                try:
                    row["ms_torch_fused"] = _time(tf)
                except Exception as e:                  # noqa: BLE001
                    row["torch_fused"] = repr(e)[:120]
            else:
                row["torch_fused"] = tf
            row["tflops_pykittens"] = flops / row["ms_pykittens"] / 1e9
            row["speedup_vs_seq"] = row["ms_seq"] / row["ms_pykittens"]
            rows.append(row)
            if rank == 0:
                print(f"{name}: seq {row['ms_seq']:.3f} ms, pykittens "
                      f"{row['ms_pykittens']:.3f} ms, torch fused "
                      f"{row.get('ms_torch_fused', float('nan')):.3f} ms", flush=True)
    if "variants" in steps:
        # what each overlap measure buys: the fused kernels with one of them turned off
        for name, kind, ms, k, n in cases(world):
            if not name.endswith("M=16384") and not name.endswith("M=4096"):
                continue
            x, w = rand(ms, k), rand(n, k, scale=k ** -0.5)
            if kind == "ag":
                f = pkc._fused_all_gather_linear
                variants = {"default": {}, "no proxy fence (unsafe)": {"FENCE": 0},
                            **AG_VARIANTS}
            else:
                f = pkc._fused_linear_reduce_scatter
                variants = {"default": {}, "signal at once (DEFER=0)": {"DEFER": 0}}
            for label, v in variants.items():
                ms_ = _time(lambda: f(x, w, group, **v))
                rows.append({"step": "variants", "case": name, "variant": label, "ms": ms_})
                if rank == 0:
                    print(f"{name} {label}: {ms_:.3f} ms", flush=True)
    if "profile" in steps:
        # where the host time of a fused call goes (rank 0's cProfile of 20 cached calls)
        import cProfile
        import io
        import pstats
        for kind, ms, k, n in (("ag", 2048, 8192, 5120), ("rs", 4096, 4096, 8192)):
            x, w = rand(ms, k), rand(n, k, scale=k ** -0.5)
            f = pkc.all_gather_linear if kind == "ag" else pkc.linear_reduce_scatter
            f(x, w, group, fused=True)
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                f(x, w, group, fused=True)
            prof.disable()
            torch.cuda.synchronize()
            if rank == 0:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
                print(f"--- {kind}: host profile of 20 calls ---\n" + text.getvalue()[-6000:],
                      flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"world": world, "ok": bool(ok), "rows": rows,
                       "device": torch.cuda.get_device_name(0),
                       "torch": torch.__version__}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


# all-gather + GEMM's other constants tried in the `variants` step
AG_VARIANTS = {"C from registers, 4 stages": {"TMA_STORE": 0, "STAGES": 4},
               "C staged whole, 3 stages": {"TMA_STORE": 1, "STAGES": 3}}


def builds(world: int = 2):
    """(kernel, constants) of the builds the correctness, performance and variants steps
    launch (the fused kernels of every case, and pykittens.ops.linear's GEMM alone), for
    `--prebuild` on a machine without GPUs."""
    from pykittens.kernels import comm as K
    from pykittens.ops.matmul import _plan
    fused = [(kind, ms, k, n) for _, kind, ms, k, n in cases(world)]
    fused += [("ag", 256, 512, 512), ("ag", 1024, 4096, 1024), ("rs", 512, 768, 256),
              ("rs", 2048, 1024, 2048)]
    for kind, ms, k, n in fused:
        if kind == "ag":
            consts = {"WORLD": world, **K.ws_plan(ms, k, n, 2)}
            yield K.ag_gemm_ws, consts
            for v in ({"FENCE": 0}, *AG_VARIANTS.values()):
                yield K.ag_gemm_ws, {**consts, **v}
            m = world * ms
        else:
            consts = K.ws_plan(ms // world, k, n, 2, staged_c=False)
            yield K.gemm_rs_ws, consts
            yield K.gemm_rs_ws, {**consts, "DEFER": 0}
            yield K.rs_reduce, {"BM": 128, "BN": consts["BN"], "SIGNALS": K.WS_SIGNALS}
            m = ms
        kernel, _, consts, _ = _plan("sm_90a", "nt", m, k, n, 2)
        yield kernel, consts


def _as_launched(kernel, consts: dict, world: int = 2) -> dict:
    """consts as pk.launch completes them from bf16 tensors and pk.Peers of `world` ranks:
    each tensor's named element type, and WORLD."""
    out = dict(consts)
    for p in kernel.params:
        if p.kind in ("gl", "peers") and isinstance(p.type.dtype, str):
            out.setdefault(p.type.dtype, "bf16")
    if "WORLD" in kernel.const_defaults:
        out.setdefault("WORLD", world)
    return out


def prebuild() -> int:
    from prebuild import ptx                     # bench/, this script's directory
    return ptx((kernel, _as_launched(kernel, consts)) for kernel, consts in builds())


def main() -> int:
    if "--prebuild" in sys.argv:            # the PTX of every build, into PYKITTENS_CACHE
        return prebuild()
    steps = sys.argv[1:] or ["correctness", "performance"]
    world = torch.cuda.device_count()
    if world < 2:
        print("bench/comm.py needs a host with 2 or more CUDA GPUs")
        return 1
    out_dir = os.environ.get("OUT", ".")
    path = os.path.join(out_dir, "comm.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    mp.spawn(_worker, args=(world, port, steps, path), nprocs=world, join=True)
    res = json.load(open(path))
    print(f"\n{world} x {res['device']}, torch {res['torch']}, {time.time() - t0:.0f} s")
    print("| correctness | pykittens rel err (vs float64) | torch rel err | |")
    print("|---|---|---|---|")
    for r in res["rows"]:
        if r["step"] == "correctness":
            te = f"{r['torch_rel_err']:.1e}" if "torch_rel_err" in r else ""
            print(f"| {r['case']} | {r['rel_err']:.1e} | {te} | {'ok' if r['ok'] else 'FAIL'} |")
    print("\n| case | err vs torch | torch seq ms | pykittens ms | torch fused ms | cuBLAS alone "
          "| pykittens GEMM alone | collective alone | host ms/call | TFLOP/s | speedup vs seq |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        if r["step"] == "performance":
            tf = f"{r['ms_torch_fused']:.3f}" if "ms_torch_fused" in r else "n/a"
            print(f"| {r['case']} | {r['rel_err']:.1e} | {r['ms_seq']:.3f} | "
                  f"{r['ms_pykittens']:.3f} | {tf} | {r['ms_gemm_alone']:.3f} | "
                  f"{r['ms_pykittens_gemm_alone']:.3f} | "
                  f"{r['ms_collective_alone']:.3f} | {r['host_ms_pykittens']:.2f} | "
                  f"{r['tflops_pykittens']:.0f} | "
                  f"{r['speedup_vs_seq']:.2f}x |")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

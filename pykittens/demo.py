"""`pykittens demo`: the whole system on whatever machine this is.

On a CPU machine it traces, lowers and emulates every library kernel for every target and
compares with numpy; then it compiles them (where the toolchains are installed) and prints the
resource tables, a short chiplet study, and two ranks of the all-gather GEMM exchanging tiles
in the emulator. With a CUDA GPU present, the kernels also run there.
"""
from __future__ import annotations

import time

import numpy as np

from .bench import text_table
from .kernels import KERNELS
from .kernels.spec import check
from .targets import NAMES


def emulator_section(quick: bool) -> tuple[str, bool]:
    rows, ok_all = [], True
    rng = np.random.default_rng(0)
    for spec in KERNELS.values():
        shapes = spec.shapes[1:2] if quick else spec.shapes[1:3]
        for target in spec.targets:
            for dt in spec.dtypes:
                for shape in shapes:
                    t0 = time.time()
                    r = check(spec, shape, dt, target, rng)[spec.outputs[0]]
                    ok = r["rel_err"] <= spec.tolerance(dt)
                    ok_all &= ok
                    rows.append([spec.name, target, dt, "x".join(map(str, shape)),
                                 f"{r['rel_err']:.2e}", f"{r['max_abs_err']:.2e}",
                                 "ok" if ok else "FAIL", f"{time.time() - t0:.2f}s"])
    head = ["kernel", "target", "dtype", "shape", "rel_err", "max_abs", "check", "time"]
    return text_table(rows, head), ok_all


def toolchain_lines() -> list[str]:
    """Which tools this machine has, and for each missing one what it is needed for and how
    to get it (a one-vendor install, a Python without rocm-llvm-python)."""
    from .toolchain import tools
    st = tools.status()
    have = [t.name + (f" {t.found}" if t.name in ("llvmlite", tools.ROCM) else "")
            for t in st if t.found]
    out = ["  toolchains here: " + (", ".join(have) or "none")]
    for t in st:
        if t.found is None:
            out.append(f"  missing {t.name} ({t.purpose}): {t.hint}")
    return out


def compile_section() -> str:
    from . import compiler
    from .toolchain.tools import ToolMissing
    rows, notes, wanting = [], [], {}
    for spec in KERNELS.values():
        for target in spec.targets:
            try:
                rep = compiler.report(spec.kernel, target, **spec.compile_consts)
            except ToolMissing as e:
                wanting.setdefault(e.tool, []).append(f"{spec.name}/{target}")
                continue
            except Exception as e:  # noqa: BLE001 - shown to the user, demo goes on
                notes.append(f"{spec.name}/{target}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:140]}")
                continue
            regs = rep.get("vgpr", rep.get("registers"))
            rows.append([spec.name, target, regs, rep.get("agpr", "-"),
                         rep.get("lds_bytes", rep.get("smem_bytes")),
                         rep.get("scratch_bytes", rep.get("spill_bytes")),
                         rep.get("occupancy_waves_per_simd", "-")])
    head = ["kernel", "target", "vgpr/regs", "agpr", "lds/smem", "scratch/spill", "waves/SIMD"]
    out = "\n".join(toolchain_lines()) + "\n"
    out += text_table(rows, head) if rows else "(no code objects were built)"
    for tool, which in wanting.items():
        out += f"\n  not built without {tool}: {', '.join(which)}"
    if notes:
        out += "\n" + "\n".join("  not built: " + n for n in notes)
    return out


def chiplet_section() -> str:
    try:
        from .chiplet.cli import demo_report
    except ImportError as e:
        return f"(chiplet study unavailable: {e})"
    return demo_report()


def comm_section() -> tuple[str, bool]:
    """Two ranks of the all-gather + GEMM kernels emulated together (pk.emulate_world) on
    every target, each rank's result against float64; then the same launches with epoch 0,
    so the GEMM waits for nothing, which the emulator reports as a race."""
    import ml_dtypes

    from . import emulate_world
    from .emulator.machine import Race
    from .kernels import comm
    from .lang.kernel import Peers
    rng = np.random.default_rng(0)
    bf, world, ms, k, n = ml_dtypes.bfloat16, 2, 96, 80, 100
    rows, ok = [], True
    for target in NAMES:
        xs = [rng.standard_normal((ms, k)).astype(bf) for _ in range(world)]
        w = rng.standard_normal((n, k)).astype(bf)
        plan = comm.ag_plan(ms, k, n, world)
        gathered = [np.zeros((world * ms, k), bf) for _ in range(world)]
        ready = [np.zeros(plan["ready"], np.int32) for _ in range(world)]
        launches = []
        for r in range(world):
            launches += [(comm.ag_send, (xs[r], Peers(gathered, r), Peers(ready, r)),
                          {"grid": plan["send_grid"]}),
                         (comm.ag_gemm, (gathered[r], w, np.zeros((world * ms, n), np.float32),
                                         ready[r], r, 1),
                          {"grid": plan["gemm_grid"], "WORLD": world})]
        out = emulate_world(launches, target=target)
        want = np.concatenate(xs).astype(np.float64) @ w.astype(np.float64).T
        errs = [float(np.linalg.norm(out[2 * r + 1]["out"] - want) / np.linalg.norm(want))
                for r in range(world)]
        good = max(errs) < 1e-5
        ok &= good
        rows.append(["all-gather + GEMM", target, f"{world} ranks", f"{max(errs):.2e}",
                     "ok" if good else "FAIL"])
    try:                                  # the same without the GEMM's wait: a race
        xs = [rng.standard_normal((ms, k)).astype(bf) for _ in range(world)]
        emulate_world([(comm.ag_send, (xs[r], Peers(gathered, r), Peers(ready, r)),
                        {"grid": plan["send_grid"]}) for r in range(world)] +
                      [(comm.ag_gemm, (gathered[r], w, np.zeros((world * ms, n), np.float32),
                                       ready[r], r, 0), {"grid": plan["gemm_grid"],
                                                         "WORLD": world})
                       for r in range(world)], target="gfx950")
        caught = "not reported"
        ok = False
    except Race as e:
        msg = str(e)
        caught = "reported: " + msg[msg.find("race on"):][:70] + "..."
    table = text_table(rows, ["kernels", "target", "world", "rel err", "result"])
    return table + "\nwith epoch 0 (the GEMM waits for nothing): " + caught, ok


def gpu_section() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from .bench import gpu
    results = gpu.check_library("small") + gpu.emulator_agreement()
    head = ["check", "kernel", "dtype", "shape", "rel err", "result"]
    return text_table(gpu.summary_rows(results), head)


def run_demo(quick: bool = False) -> int:
    t0 = time.time()
    gpu = gpu_section()
    where = "a CUDA GPU is present: kernels also run on it" if gpu else \
        "no GPU here: kernels run in the lane-exact emulator"
    print(f"pykittens demo — {where}\n")
    print("1. Library kernels emulated for every target vs numpy (relative Frobenius error)")
    table, ok = emulator_section(quick)
    print(table + "\n")
    print("2. Code objects: resource reports")
    print(compile_section() + "\n")
    print("3. Chiplet study (cache simulator)")
    print(chiplet_section() + "\n")
    print("4. Tile-level communication between GPUs, emulated (pk.emulate_world)")
    comm_table, comm_ok = comm_section()
    print(comm_table + "\n")
    ok &= comm_ok
    if gpu:
        print("5. On the GPU")
        print(gpu + "\n")
    print(f"demo finished in {time.time() - t0:.1f}s: "
          f"{'all emulator checks passed' if ok else 'SOME CHECKS FAILED'}")
    return 0 if ok else 1

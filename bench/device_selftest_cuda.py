"""Device self-test of the NVIDIA path: toolchain.nvptx -> analysis.cubin -> runtime.cuda.

Run on the GPU machine:  PYTHONPATH=. python3 bench/device_selftest_cuda.py

A hand-written LLVM IR kernel (out[i] = alpha*x[i] + y[i], kernel ABI of ir.abi, passed
through 100 KiB of dynamic shared memory so the >48 KiB opt-in is exercised, with a barrier
and a lane swap so a wrong smem setup gives wrong numbers rather than passing by luck) is
compiled, loaded as a cubin (ptxas) and as PTX (driver JIT), and launched on torch CUDA
tensors on the current stream and on a side stream. Exits non-zero if any check fails.
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import torch

from pykittens.analysis import cubin as cubin_report
from pykittens.ir import types as T
from pykittens.ir.nodes import Param
from pykittens.runtime import cuda as rc
from pykittens.toolchain import nvptx

SMEM_BYTES = 100 << 10          # dynamic shared memory per block: above the 48 KiB default
BLOCK = 256
SLOT0 = (SMEM_BYTES >> 2) - BLOCK   # each thread's float slot sits in the last KiB of smem

IR = r"""
target triple = "nvptx64-nvidia-cuda"

@dsmem = external addrspace(3) global [0 x float], align 16

define ptx_kernel void @axpy(ptr addrspace(1) %x, i32 %x.size0, i32 %x.stride0,
                             ptr addrspace(1) %y, i32 %y.size0, i32 %y.stride0,
                             ptr addrspace(1) %out, i32 %out.size0, i32 %out.stride0,
                             float %alpha) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %ntid = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %ctaid = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %nctaid = call i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()
  %base0 = mul i32 %ctaid, %ntid
  %step = mul i32 %nctaid, %ntid
  %mate = xor i32 %tid, 1
  %slot = add i32 %tid, SLOT0
  %mslot = add i32 %mate, SLOT0
  %ps = getelementptr float, ptr addrspace(3) @dsmem, i32 %slot
  %pm = getelementptr float, ptr addrspace(3) @dsmem, i32 %mslot
  %any = icmp slt i32 %base0, %x.size0
  br i1 %any, label %loop, label %exit
loop:
  %base = phi i32 [%base0, %entry], [%bnext, %tail]
  %i = add i32 %base, %tid
  %inb = icmp slt i32 %i, %x.size0
  br i1 %inb, label %ld, label %st
ld:
  %xo = mul i32 %i, %x.stride0
  %px = getelementptr float, ptr addrspace(1) %x, i32 %xo
  %xv = load float, ptr addrspace(1) %px
  %ax = fmul float %alpha, %xv
  br label %st
st:
  %v = phi float [%ax, %ld], [0.0, %loop]
  store float %v, ptr addrspace(3) %ps
  call void @llvm.nvvm.barrier0()
  %w = load float, ptr addrspace(3) %pm
  %j = add i32 %base, %mate
  %jin = icmp slt i32 %j, %out.size0
  br i1 %jin, label %wr, label %tail
wr:
  %yo = mul i32 %j, %y.stride0
  %py = getelementptr float, ptr addrspace(1) %y, i32 %yo
  %yv = load float, ptr addrspace(1) %py
  %r = fadd float %w, %yv
  %oo = mul i32 %j, %out.stride0
  %po = getelementptr float, ptr addrspace(1) %out, i32 %oo
  store float %r, ptr addrspace(1) %po
  br label %tail
tail:
  call void @llvm.nvvm.barrier0()
  %bnext = add i32 %base, %step
  %more = icmp slt i32 %bnext, %x.size0
  br i1 %more, label %loop, label %exit
exit:
  ret void
}

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.nctaid.x()
declare void @llvm.nvvm.barrier0()
""".replace("SLOT0", str(SLOT0))

PARAMS = [Param("x", "gl", T.GlobalType(T.f32, (None,))),
          Param("y", "gl", T.GlobalType(T.f32, (None,))),
          Param("out", "gl", T.GlobalType(T.f32, (None,))),
          Param("alpha", "scalar", T.ScalarType(T.f32))]

rows: list[tuple[str, str, str]] = []


def record(name: str, fn) -> None:
    try:
        detail = fn() or ""
        rows.append((name, "ok", detail))
    except Exception as e:
        traceback.print_exc()
        rows.append((name, "FAIL", f"{type(e).__name__}: {e}"[:160]))


def expect_error(fn, exc, words: str) -> str:
    try:
        fn()
    except exc as e:
        if words not in str(e):
            raise AssertionError(f"error message lacks {words!r}: {e}")
        return f"raised {type(e).__name__}"
    raise AssertionError(f"expected {exc.__name__}")


def dyn_smem_attr(f) -> str:
    if f._dyn_limit < SMEM_BYTES:
        raise AssertionError(f"MAX_DYNAMIC_SHARED_SIZE_BYTES left at {f._dyn_limit}")
    return f"MAX_DYNAMIC_SHARED_SIZE_BYTES = {f._dyn_limit}"


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA device visible to torch"
    d = rc.driver()
    drv = rc.check(d.cuDriverGetVersion(), "cuDriverGetVersion")
    print(f"GPU: {torch.cuda.get_device_name()}  driver API {drv // 1000}.{drv % 1000 // 10}  "
          f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"toolchain: {nvptx.toolchain_version()}")

    t0 = time.perf_counter()
    res = nvptx.compile_ir(IR, "sm_90a", use_cache=False)
    print(f"compile_ir: {time.perf_counter() - t0:.2f} s, kernels {res['kernels']}, "
          f"cubin {'%d bytes' % len(res['cubin']) if res['cubin'] else 'none'}")
    print(res["ptxas_log"].strip())
    print("analysis.cubin.report:", json.dumps(cubin_report.report(res, kernel="axpy"),
                                                indent=1))

    n, alpha = 1_000_003, 1.7                  # ragged: not a multiple of the block
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, device="cuda", generator=g)
    y = torch.randn(n, device="cuda", generator=g)
    ref = alpha * x + y
    grid = 264                                  # 2 blocks per SM on an H200: grid-stride loop

    def run_and_check(f, stream=None, raw=False) -> str:
        out = torch.full_like(x, float("nan"))
        bound = {"x": x, "y": y, "out": out, "alpha": alpha}
        if stream is not None:          # `out` was filled on the current stream
            stream.wait_stream(torch.cuda.current_stream())
        if raw:
            kargs, values = rc.kernel_arg_values(PARAMS, bound, device=f.module.device)
            f.launch(grid, BLOCK, rc.pack(kargs, values), shared_bytes=SMEM_BYTES,
                     stream=stream)
        else:
            rc.launch(f, PARAMS, bound, grid, BLOCK, shared_bytes=SMEM_BYTES, stream=stream)
        (stream if stream is not None else torch.cuda.current_stream()).synchronize()
        err = (out - ref).abs().max().item()
        if not err <= 1e-6 * ref.abs().max().item():     # NaN fails too
            raise AssertionError(f"max abs error {err}")
        return f"max|err| {err:.2e}"

    def timing(f) -> str:
        out = torch.empty_like(x)
        bound = {"x": x, "y": y, "out": out, "alpha": alpha}
        kargs, values = rc.kernel_arg_values(PARAMS, bound, device=f.module.device)
        buf = rc.pack(kargs, values)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            f.launch(grid, BLOCK, buf, shared_bytes=SMEM_BYTES)
        start.record()
        for _ in range(50):
            f.launch(grid, BLOCK, buf, shared_bytes=SMEM_BYTES)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / 50
        return f"{ms * 1e3:.1f} us/launch, {3 * 4 * n / ms / 1e6:.0f} GB/s"

    images = [("cubin", res["cubin"]), ("ptx-jit", res["ptx"])]
    for kind, image in images:
        if image is None:
            rows.append((f"{kind}: load", "SKIP", "no ptxas: " + nvptx.install_hint("ptxas")))
            continue
        mod = {}

        def load(kind=kind, image=image, mod=mod):
            mod["m"] = rc.Module(image)
            f = mod["f"] = mod["m"].function("axpy")
            layout = f.param_layout()
            return (f"{mod['m'].kind}, {f.registers} regs, static smem {f.static_smem}, "
                    f"param layout {layout}")
        record(f"{kind}: load", load)
        if "f" not in mod:
            continue
        f = mod["f"]
        record(f"{kind}: current stream", lambda f=f: run_and_check(f))
        side = torch.cuda.Stream()

        def on_side(f=f, side=side):
            with torch.cuda.stream(side):
                return run_and_check(f) + " (torch.cuda.stream ctx)"
        record(f"{kind}: side stream", on_side)
        record(f"{kind}: explicit stream, bytes args",
               lambda f=f, side=side: run_and_check(f, stream=side, raw=True))
        record(f"{kind}: dyn smem attr set", lambda f=f: dyn_smem_attr(f))
        record(f"{kind}: timing", lambda f=f: timing(f))

    if any(r[0].endswith(": load") and r[1] == "ok" for r in rows):
        f = rc.Module(res["ptx"]).function("axpy")
        out = torch.empty_like(x)
        record("error: too much smem", lambda: expect_error(
            lambda: rc.launch(f, PARAMS, {"x": x, "y": y, "out": out, "alpha": alpha}, grid,
                              BLOCK, shared_bytes=300 << 10), rc.CudaError, "per-block limit"))
        record("error: cpu tensor", lambda: expect_error(
            lambda: rc.launch(f, PARAMS, {"x": x.cpu(), "y": y, "out": out, "alpha": alpha},
                              grid, BLOCK), rc.CudaError, "move it to the GPU"))
        record("error: dtype", lambda: expect_error(
            lambda: rc.launch(f, PARAMS, {"x": x.half(), "y": y, "out": out, "alpha": alpha},
                              grid, BLOCK), TypeError, "element type"))
        record("error: strided", lambda: expect_error(
            lambda: rc.launch(f, PARAMS, {"x": torch.randn(2 * n, device="cuda")[::2], "y": y,
                                          "out": out, "alpha": alpha}, grid, BLOCK),
            ValueError, "contiguous"))
        record("error: misaligned", lambda: expect_error(
            lambda: rc.launch(f, PARAMS, {"x": x[1:], "y": y[1:], "out": out[1:],
                                          "alpha": alpha}, grid, BLOCK),
            ValueError, "aligned"))
        if f.param_layout() is not None:       # without it a short buffer would launch
            record("error: short arg buffer", lambda: expect_error(
                lambda: rc.Module(res["ptx"]).function("axpy").launch(
                    grid, BLOCK, [("ptr", x.data_ptr()), ("i32", n)]), rc.CudaError, "bytes"))
        record("error: unknown kernel", lambda: expect_error(
            lambda: rc.Module(res["ptx"]).function("axpyy"), rc.CudaError,
            "cuModuleGetFunction"))

    torch.cuda.synchronize()
    w = max(len(r[0]) for r in rows)
    print(f"\n{'check':<{w}}  result  detail")
    for name, status, detail in rows:
        print(f"{name:<{w}}  {status:<6}  {detail}")
    failed = [r for r in rows if r[1] == "FAIL"]
    print(f"\n{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

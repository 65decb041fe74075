"""pk.launch: what can be checked without a GPU (the GPU runs are in bench/device_check.py)."""
import numpy as np
import pytest

import pykittens as pk
from pykittens.kernels import scaled_add


def test_launch_needs_gpu_tensors():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(pk.KernelError, match="argument 'x' of scaled_add is on the CPU; move "
                                             "it to the GPU"):
        pk.launch(scaled_add, x, x, x, 1.0, grid=1)

    @pk.kernel
    def no_tensors(n: pk.i32):
        pass

    with pytest.raises(pk.KernelError, match="needs at least one GPU tensor"):
        pk.launch(no_tensors, 1, grid=1)


def test_launch_checks_arguments_first():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(pk.KernelError, match="missing argument"):
        pk.launch(scaled_add, x, x, grid=1)
    with pytest.raises(pk.KernelError, match="element type i32 but the kernel expects f32"):
        pk.emulate(scaled_add, x, x, np.ones((4, 64), np.int32), 1.0, grid=1, DT="f32")


def test_hip_path_says_where_it_runs():
    """No ROCm here: the HIP launcher's own error names what is missing and what to do."""
    from pykittens.runtime import hip
    with pytest.raises(hip.HipError, match="no HIP runtime"):
        hip.hip_runtime()


def test_emulate_accepts_torch_cpu_tensors():
    torch = pytest.importorskip("torch", reason="torch is optional (tensor interop)")
    x = torch.randn(37, 100)
    out = pk.emulate(pk.kernels.softmax, x, torch.zeros(37, 100), grid=(3,),
                     target="gfx950")["out"]
    np.testing.assert_allclose(out, torch.softmax(x, 1).numpy(), atol=1e-6)
    with pytest.raises(pk.KernelError, match="element type bf16 but the kernel expects f32"):
        pk.emulate(scaled_add, x, x.bfloat16(), x, 1.0, grid=1, DT="f32")


def test_torch_references_match_numpy(rng):
    torch = pytest.importorskip("torch", reason="torch is optional (tensor interop)")
    from pykittens.kernels import KERNELS
    for spec in KERNELS.values():
        inputs = spec.make_inputs(spec.shapes[0], pk.f32, rng)
        t = {k: torch.from_numpy(v).double() if isinstance(v, np.ndarray) else v
             for k, v in inputs.items()}
        got = spec.torch_reference(t)[spec.outputs[0]].numpy()
        np.testing.assert_allclose(got, spec.reference(inputs)[spec.outputs[0]], atol=1e-12)


class _GPUTensor:
    """A stand-in for a torch GPU tensor: what pk.launch reads before it compiles."""

    def __init__(self, shape, ptr, dtype="torch.int32"):
        self.shape, self._ptr, self.dtype = tuple(shape), ptr, dtype
        self.device = type("Dev", (), {"type": "cuda", "index": 0,
                                       "__str__": lambda s: "cuda:0"})()

    def stride(self, dim=None):
        s = (self.shape[1], 1)
        return s if dim is None else s[dim]

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self.shape[0] * self.shape[1]


@pk.kernel
def mapped(out: pk.gl[pk.i32, 2], MAP: pk.const = None):
    r, c = MAP(pk.program_id(0))
    pk.store(out, pk.full(pk.rt((1, 64), pk.i32), r * 100 + c), (r, c * 64))


def test_launch_cache_keys_constants_by_value(monkeypatch):
    """Two grid mappings that print alike ('row-major') over different grids are different
    kernels: the launch cache keys constants by value and type, not by their text."""
    from pykittens import chiplet, compiler
    from pykittens.runtime import cuda, launch
    m23, m32 = chiplet.gemm_row_major(2, 3), chiplet.gemm_row_major(3, 2)
    assert str(m23) == str(m32) and m23 != m32
    built, launched = [], []
    monkeypatch.setattr(launch, "_modules", {})
    monkeypatch.setattr(launch, "gpu_target", lambda index: "sm_90a")
    monkeypatch.setattr(compiler, "compile_lane", lambda prog, aligned: built.append(prog) or {})
    monkeypatch.setattr(cuda.Module, "from_compiled", classmethod(
        lambda cls, obj, device: type("M", (), {"function": lambda s, n: n})()))
    monkeypatch.setattr(cuda, "launch", lambda fn, params, bound, grid, block, **kw:
                        launched.append(grid))
    out = _GPUTensor((3, 192), 0x7F0000000000)
    for m in (m23, m32, m23, m32):
        pk.launch(mapped, out, grid=(6,), MAP=m)
    assert len(built) == 2 and built[0] is not built[1] and len(launched) == 4
    # the two programs differ: each maps launch ids through its own grid
    a, b = (pk.emulate(mapped, np.zeros((3, 192), np.int32), grid=6, target="sm_90a",
                       MAP=m)["out"] for m in (m23, m32))
    assert not np.array_equal(a, b)
    from pykittens.lang.kernel import const_key
    assert len({const_key({"N": v}) for v in (1, 1.0, True)}) == 3    # equal, not the same


def test_tensor_maps_of_recent_addresses_are_kept():
    """A tensor map is a function of its geometry and address: a replayed launch whose
    output comes back at one of a few addresses (torch's caching allocator) encodes each
    once; the oldest is dropped past TensorMap.RECENT."""
    from pykittens.runtime import cuda
    tm = object.__new__(cuda.TensorMap)
    tm._recent, encoded = {}, []
    tm._encode = lambda address: encoded.append(address) or address.to_bytes(128, "little")
    for address in (0x1000, 0x2000, 0x1000, 0x2000, 0x1000):
        assert tm.encode(address) == address.to_bytes(128, "little")
    assert encoded == [0x1000, 0x2000]
    for address in range(0x3000, 0x3000 + 16 * cuda.TensorMap.RECENT, 16):
        tm.encode(address)
    assert len(tm._recent) == cuda.TensorMap.RECENT and 0x1000 not in tm._recent



@pk.kernel
def _three_scalars(x: pk.gl[pk.f32, 2], a: pk.f32, n: pk.i32, b: pk.f32):
    pass                                 # its arguments' packing is what is tested


def _rmsnorm_args(seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 1024, generator=g).to(torch.bfloat16)
    return {"x": x, "w": torch.randn(1024, generator=g).to(torch.bfloat16),
            "out": torch.empty_like(x), "rstd": torch.empty(8), "eps": 1e-5 * seed}


def _three_scalars_args(seed):
    import torch
    return {"x": torch.zeros(4, 64), "a": 0.5 * seed, "n": -3 * seed, "b": 2.0 ** seed}


@pytest.mark.parametrize("which", ["rmsnorm", "three scalars"])
def test_a_plan_packs_a_launchs_arguments_as_the_checked_path_does(which):
    """A _Plan (pk.launch's replay of a checked launch) writes each launch's addresses and
    scalars into its argument buffer, in runs of adjacent ones (rmsnorm: one argument a
    run; three scalars side by side: one run): given tensors (pk.launch's fast path) or
    their addresses (a replayed op call), it must hand the driver the bytes the checked
    path packs for the same arguments (runtime.cuda.pack, written apart from the plan's
    packers). Checked here with the driver call stood in for."""
    torch = pytest.importorskip("torch")
    from pykittens.ir.abi import kernel_args
    from pykittens.kernels import rmsnorm, stats_launch
    from pykittens.lower import lower
    from pykittens.runtime import cuda
    from pykittens.runtime.args import check_scalar
    from pykittens.runtime.launch import _Plan

    sent = []

    class Function:                      # the driver's side: records what each launch sends
        handle, module = 0, type("Module", (), {"device": 0})()

        def launches_early(self, *_):
            return False

        def launch_checked(self, grid, block, args, shared, stream):
            sent.append(bytes(args.data)[:len(packed)])

    if which == "rmsnorm":
        kernel, args = rmsnorm, _rmsnorm_args
        grid, consts = stats_launch({"x": args(1)["x"]}, "sm_90a")
        consts["DT"] = "bf16"
    else:
        kernel, args, grid, consts = _three_scalars, _three_scalars_args, (1,), {}
    prog = lower(kernel.specialize_for("sm_90a", **consts), "sm_90a")
    kargs = kernel_args(prog.params)
    by_name = {p.name: p for p in prog.params}

    def checked(bound):                 # the checked path's values and bytes
        values = [cuda.tensor_value(a, bound[a.param]) if a.kind in ("ptr", "size", "stride")
                  else check_scalar(bound[a.param], a.name, by_name[a.param].type.dtype)
                  for a in kargs]
        return values, cuda.pack(kargs, values)

    first = args(1)
    values, packed = checked(first)
    plan = _Plan(kernel, cuda.dims3(grid, "grid"), first, prog.params, function=Function(),
                 block=(128, 1, 1), kargs=kargs, values=values, buf=packed)
    for seed in (2, 3):
        bound = args(seed)
        want = checked(bound)[1]
        assert want != packed                              # new addresses or scalars
        vals = plan.values((), bound)
        assert plan.passes(vals)
        plan.launch(vals, 0)                               # tensors, as pk.launch's
        addresses = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in vals]
        plan.launch(addresses, 0, True)                    # addresses, as a replay's
        assert sent[-2:] == [want, want], seed

"""pk.launch's fast path, on a stand-in CUDA driver (it records what cuLaunchKernel gets)
and CPU tensors that report cuda:0 — real kernels, cubins, argument checks and packing; only
the driver is stubbed. The fast path must hand the driver exactly what the checked path
does (pointers, scalars, re-encoded TMA maps), and cost less host time."""
import ctypes
import math
import struct
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import pykittens as pk  # noqa: E402
from pykittens.kernels import KERNELS, gemm_ws_launch, stats_launch  # noqa: E402
from pykittens.runtime import cuda as rc  # noqa: E402
from pykittens.runtime import launch as launch_mod  # noqa: E402

pytestmark = pytest.mark.usefixtures("module_cache")


class _Member:
    """An enum member as the bindings give it: a name and an int value."""

    def __init__(self, name):
        self.name = name

    def __int__(self):
        return len(self.name)


class _Enum:
    def __getattr__(self, name):
        return _Member(name)


class FakeDriver:
    """The cuda.bindings.driver calls the launcher makes, answering like one GPU."""
    CUfunction_attribute = CUdevice_attribute = CUtensorMapDataType = _Enum()
    CUtensorMapSwizzle = CUtensorMapInterleave = CUtensorMapL2promotion = _Enum()
    CUtensorMapFloatOOBfill = _Enum()
    cuuint32_t = cuuint64_t = int

    def __init__(self):
        self.launches, self.maps = [], []

    @staticmethod
    def CUstream(handle):
        return handle

    def cuInit(self, flags): return (0,)
    def cuDeviceGetCount(self): return (0, 1)
    def cuDeviceGet(self, i): return (0, i)
    def cuDevicePrimaryCtxRetain(self, dev): return (0, 1234)
    def cuCtxGetCurrent(self): return (0, 1234)
    def cuModuleLoadData(self, data): return (0, 1)
    def cuModuleGetFunction(self, module, name): return (0, 7)
    sms, resident = 132, 8     # SMs, and workgroups an SM holds (any kernel)

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, self.sms if attr.name == "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT" else
                232448)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f, threads, shared):
        return (0, self.resident)
    def cuFuncSetAttribute(self, f, attr, value): return (0,)

    def cuFuncGetAttribute(self, attr, f):
        return (0, {"CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024,
                    "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": 49152}.get(attr.name, 0))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        words = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(words[3]).value
        self.launches.append(((gx, gy, gz), (bx, by, bz), shared, stream,
                              ctypes.string_at(words[1], size)))
        return (0,)

    def cuTensorMapEncodeTiled(self, dt, rank, ptr, sizes, strides, box, *rest):
        self.maps.append(ptr)
        m = ctypes.create_string_buffer(struct.pack("<Q", ptr) + bytes(120))
        return 0, SimpleNamespace(getPtr=lambda: ctypes.addressof(m), keep=m)


class OnGPU(torch.Tensor):
    """A CPU tensor that says it is on cuda:0: the launcher reads its metadata and address,
    never its data."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", 0)


def gpu(t):
    return torch.Tensor._make_subclass(OnGPU, t)


@pytest.fixture
def driver(monkeypatch):
    d = FakeDriver()
    monkeypatch.setattr(rc, "_DRIVER", d)
    monkeypatch.setattr(rc, "_INIT", True)
    monkeypatch.setattr(rc, "_CTX", {})
    monkeypatch.setattr(launch_mod, "gpu_target", lambda index: "sm_90a")
    monkeypatch.setattr(launch_mod, "_modules", {})
    monkeypatch.setattr(launch_mod, "_plans", {})
    return d


def rms_call(m=37, n=700, eps=1e-5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = gpu(torch.randn(m, n, generator=g).bfloat16())
    args = (x, gpu(torch.randn(n, generator=g).bfloat16()), gpu(torch.empty(m, n).bfloat16()),
            gpu(torch.empty(m)), eps)
    grid, consts = stats_launch({"x": x}, "sm_90a")
    return KERNELS["rmsnorm"].kernel, args, grid, consts


def gemm_call(seed=0):
    """gemm_ws: TMA tensor maps of A and B among its arguments."""
    g = torch.Generator().manual_seed(seed)
    a, b = (gpu(torch.randn(s, generator=g).bfloat16()) for s in ((150, 128), (200, 128)))
    c = gpu(torch.empty(150, 200).bfloat16())
    grid, consts = gemm_ws_launch({"a": a, "b": b, "c": c}, "sm_90a")
    return KERNELS["gemm_ws"].kernel, (a, b, c), grid, consts


def run(call, driver, fast, stream=5, **kw):
    kernel, args, grid, consts = call
    launch_mod.FAST_PATH = fast
    try:
        pk.launch(kernel, *args, grid=grid, stream=stream, **kw, **consts)
    finally:
        launch_mod.FAST_PATH = True
    return driver.launches[-1]


@pytest.mark.parametrize("make", [rms_call, gemm_call])
def test_fast_path_launches_what_the_checked_path_does(driver, make):
    one, two = make(seed=0), make(seed=1)                 # same signature, other tensors
    want = [run(c, driver, fast=False) for c in (one, two)]
    assert want[0][4] != want[1][4]                       # the pointers differ
    maps_before = len(driver.maps)
    got = [run(c, driver, fast=True) for c in (one, two, one)]   # checked, then fast twice
    assert got == [want[0], want[1], want[0]]
    assert len(launch_mod._plans) == 1
    if make is gemm_call:       # checked: one's maps; then re-encoded as the tensors move
        per_call = maps_before // 2
        assert per_call >= 2
        assert driver.maps[maps_before:] == driver.maps[:maps_before] + driver.maps[:per_call]
    else:
        assert not driver.maps


def test_a_new_signature_takes_the_checked_path(driver):
    base = rms_call()
    run(base, driver, fast=True)
    kernel, args, grid, consts = base
    # a scalar's value is packed per call; its type, a shape or a stride is a new signature
    other_eps = (kernel, args[:4] + (1e-3,), grid, consts)
    assert run(other_eps, driver, fast=True) == run(other_eps, driver, fast=False)
    assert len(launch_mod._plans) == 1
    run(rms_call(m=20), driver, fast=True)
    assert len(launch_mod._plans) == 2
    strided = gpu(torch.empty(37, 1400).bfloat16()[:, :700])
    run((kernel, (strided,) + args[1:], grid, consts), driver, fast=True)
    assert len(launch_mod._plans) == 3
    # what the checks reject is rejected whichever path would run
    with pytest.raises(pk.KernelError, match="element type f32 but the kernel expects bf16"):
        pk.launch(kernel, args[0], gpu(torch.empty(700)), *args[2:], grid=grid, stream=5,
                  **consts)
    with pytest.raises(pk.KernelError, match="must be a number"):
        pk.launch(kernel, *args[:4], "eps", grid=grid, stream=5, **consts)


@pytest.mark.parametrize("make", [rms_call, gemm_call])
def test_a_cached_launch_skips_the_checked_path(driver, monkeypatch, make):
    """After a signature's first launch, its launches neither bind nor check the arguments,
    nor look up the target, module and build: the plan packs and launches (what the fast
    path saves is host time; bench/ops_bandwidth.py host measures it)."""
    call = make()
    seen = {"checked": 0, "bind": 0}
    checked, bind = launch_mod._checked_launch, launch_mod.bind_args

    def counting(name, real):
        return lambda *a, **k: seen.__setitem__(name, seen[name] + 1) or real(*a, **k)
    monkeypatch.setattr(launch_mod, "_checked_launch", counting("checked", checked))
    monkeypatch.setattr(launch_mod, "bind_args", counting("bind", bind))
    for _ in range(4):
        run(call, driver, fast=True)
    assert seen == {"checked": 1, "bind": 1} and len(driver.launches) == 4


def test_the_fast_path_keeps_the_argument_rules(driver, monkeypatch):
    """A call whose signature matches a plan still meets every rule of runtime.args: what
    varies from call to call (scalar values, tensors overlapping in memory) is checked on
    the fast path too, and what looks alike to Python (a float grid, a bool scalar, an
    argument given twice) never reaches a plan."""
    kernel, args, grid, consts = base = rms_call()
    run(base, driver, fast=True)
    assert len(launch_mod._plans) == 1
    launches = len(driver.launches)

    def refused(match, *a, grid=grid, **kw):
        with pytest.raises(pk.KernelError, match=match):
            pk.launch(kernel, *a, grid=grid, stream=5, **kw, **consts)
        assert len(driver.launches) == launches

    refused("grid sizes must be ints", *args, grid=tuple(float(g) for g in grid))
    refused("must be a number", *args[:4], True)
    refused("given twice", *args, out=args[2])
    refused("overflows f32", *args[:4], 1e39)
    # an output overlapping the input, shifted by 16 bytes: same signature, other views
    m, n = args[0].shape
    buf = torch.empty(m * n + 8).bfloat16()
    x, out = gpu(buf[:m * n].view(m, n)), gpu(buf[8:].view(m, n))
    assert x.data_ptr() % 16 == args[0].data_ptr() % 16 == out.data_ptr() % 16
    refused("overlap in memory but are different views", x, args[1], out, *args[3:])
    assert len(launch_mod._plans) == 1
    # the same view as input and output (an in-place update) is allowed on either path
    inplace = (kernel, (args[0], args[1], args[0]) + args[3:], grid, consts)
    checked = []
    real = launch_mod._checked_launch
    monkeypatch.setattr(launch_mod, "_checked_launch", lambda *a: checked.append(1) or real(*a))
    fast = run(inplace, driver, fast=True)
    assert not checked                                     # the plan launched it
    assert fast == run(inplace, driver, fast=False) and checked == [1]
    assert len(launch_mod._plans) == 1


class FakeLibcuda:
    """libcuda through ctypes as cuda.Launcher and launch_checked call it: records what
    each launch hands the driver, answers `refuse` (a CUresult) to the untyped call and
    reports `current` as the thread's context."""

    encode_tiled = None                 # tensor maps: through the bindings (FakeDriver)

    def __init__(self, current=1234, refuse=0):
        self.current_ctx, self.refuse, self.launches = current, refuse, []
        self.early = []                 # per launch: whether it came through cuLaunchKernelEx

    def current(self):
        return self.current_ctx

    def launch_ex(self, config, f, params, extra):
        """cuLaunchKernelEx: the configuration read back as the driver reads it (the one
        attribute must allow programmatic stream serialisation)."""
        assert params is None
        if self.refuse:
            return self.refuse
        cfg = config._obj                                # what ctypes.byref points at
        assert cfg.numAttrs == 1
        attr = cfg.attrs[0]
        assert (attr.id, attr.value[0]) == (rc.PROGRAMMATIC_STREAM_SERIALIZATION, 1)
        self.early.append(True)
        return self._record(f.value, (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                            (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ), cfg.sharedMemBytes,
                            cfg.hStream or 0, extra)

    def launch_c_values(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert params is None
        if self.refuse:
            return self.refuse
        f, gx, gy, gz, bx, by, bz, shared, stream, extra = (
            v.value for v in (f, gx, gy, gz, bx, by, bz, shared, stream, extra))
        return self.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, None, extra)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        """(the typed call: ints, and `extra` as its array)"""
        self.early.append(False)
        return self._record(f, (gx, gy, gz), (bx, by, bz), shared, stream, extra)

    def _record(self, f, grid, block, shared, stream, extra):
        if type(extra) is ctypes.c_void_p:
            address = extra.value
        else:
            address = extra if type(extra) is int else ctypes.addressof(extra)
        words = (ctypes.c_void_p * 5).from_address(address)
        size = ctypes.c_size_t.from_address(words[3]).value
        self.launches.append((grid, block, shared, stream, ctypes.string_at(words[1], size)))
        return 0


@pytest.mark.parametrize("make", [rms_call, gemm_call])
def test_plans_launch_through_libcuda_with_c_values(driver, monkeypatch, make):
    """A plan's launcher hands libcuda (untyped, C values converted once) exactly what the
    bindings get on the checked path, for each call's own tensors."""
    calls = [make(seed=s) for s in (0, 1)]
    want = [run(c, driver, fast=False) for c in calls]
    lib = FakeLibcuda()
    monkeypatch.setattr(rc, "_RAW", [lib])
    got = []
    for c in (calls[0], calls[1], calls[0]):       # the first one plans (the checked path)
        n = len(driver.launches)
        run(c, driver, fast=True)
        assert len(driver.launches) == n                       # not through the bindings
        got.append(lib.launches[-1])
    assert got == [want[0], want[1], want[0]]


@pytest.mark.parametrize("make", [rms_call, gemm_call])
@pytest.mark.parametrize("early", [True, False])
def test_early_launches_carry_the_attribute_and_launch_what_the_bindings_get(
        driver, monkeypatch, make, early):
    """pykittens' own Hopper code waits for the grids before it (its PTX says so), so its
    launches through libcuda, checked and planned alike, are early ones (cuLaunchKernelEx
    allowing programmatic stream serialisation) with the arguments an ordinary launch
    gets; PYKITTENS_EARLY_LAUNCH=0 (EARLY_LAUNCH False) launches them as usual."""
    calls = [make(seed=s) for s in (0, 1)]
    want = [run(c, driver, fast=False) for c in calls]
    monkeypatch.setattr(rc, "EARLY_LAUNCH", early)
    monkeypatch.setattr(FakeDriver, "sms", 1)      # every grid here: more than one at once
    monkeypatch.setattr(FakeDriver, "resident", 1)
    launch_mod._plans.clear()
    launch_mod._modules.clear()
    lib = FakeLibcuda()
    monkeypatch.setattr(rc, "_RAW", [lib])
    got = [run(c, driver, fast=True) and lib.launches[-1] for c in (calls[0], calls[1],
                                                                   calls[0])]
    assert got == [want[0], want[1], want[0]]
    assert lib.early == [early] * 3                  # checked, then planned launches
    monkeypatch.setattr(rc, "EARLY_LAUNCH", not early)         # read at every launch
    run(calls[1], driver, fast=True)
    assert lib.early[-1] == (not early)


def test_grids_the_gpu_holds_at_once_are_launched_as_usual(driver, monkeypatch):
    """A grid of no more workgroups than the SMs hold at once (a persistent walk) is not
    launched early, whatever the code allows: launched early it would be placed on SMs as
    they free up, unevenly."""
    kernel, args, grid, consts = gemm_call()
    blocks = grid if isinstance(grid, int) else math.prod(grid)
    assert blocks % 2 == 0 and blocks > 2
    lib = FakeLibcuda()
    monkeypatch.setattr(rc, "_RAW", [lib])
    for sms, resident, early in ((blocks // 2, 2, False), (blocks // 2 - 1, 2, True),
                                 (blocks, 1, False), (blocks - 1, 1, True)):
        monkeypatch.setattr(FakeDriver, "sms", sms)
        monkeypatch.setattr(FakeDriver, "resident", resident)
        launch_mod._plans.clear()
        launch_mod._modules.clear()
        for _ in range(2):                 # checked, then the plan's launcher: alike
            pk.launch(kernel, *args, grid=grid, stream=5, **consts)
        assert lib.early[-2:] == [early, early]


def test_code_launches_early_only_where_every_kernel_waits_first():
    """A module loaded from pykittens' compile result launches early; code whose kernels
    do not all wait for the previous grids (a hand-written PTX, a cubin alone) does not."""
    from pykittens import compiler
    from pykittens.codegen.nvptx import EARLY_LAUNCH_PROLOGUE
    spec = KERNELS["column_sum"]
    ptx = compiler.code_object(spec.kernel, compiler.get_target("sm_90a"),
                               PT="f32", DT="bf16")["ptx"]
    entry = ptx[ptx.index(".entry"):]
    first = [line.strip() for line in entry.splitlines()
             if line.strip().startswith(("griddepcontrol", "ld.", "st.", "cp.", "red.",
                                         "atom.")) and not line.strip().startswith("ld.param")]
    assert tuple(first[:2]) == EARLY_LAUNCH_PROLOGUE    # before any access to memory
    assert rc.waits_for_previous_grid(ptx)
    assert not rc.waits_for_previous_grid(ptx.replace("griddepcontrol.wait;", ""))
    two = ptx + "\n.visible .entry other()\n{\n\tret;\n}\n"
    assert not rc.waits_for_previous_grid(two)              # one kernel does not wait
    assert not rc.waits_for_previous_grid(None)


def test_launch_config_has_cuda_h_layout():
    """CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out (64-bit): the driver
    reads the stream at byte 32, the attributes' pointer at 40 and their count at 48; an
    attribute's value at byte 8 of its 72."""
    C, A = rc._LaunchConfig, rc._LaunchAttribute
    assert (ctypes.sizeof(C), C.hStream.offset, C.attrs.offset, C.numAttrs.offset) == \
        (56, 32, 40, 48)
    assert (ctypes.sizeof(A), A.value.offset) == (72, 8)
    cfg = rc.LaunchConfig((3, 2, 1), (384, 1, 1), 1000)
    raw = bytes(cfg.config)
    assert struct.unpack_from("<7I", raw) == (3, 2, 1, 384, 1, 1, 1000)
    cfg.stream(0xABC0)
    assert struct.unpack_from("<Q", bytes(cfg.config), 32) == (0xABC0,)
    attr = bytes(cfg.attribute)
    assert struct.unpack_from("<ii", attr, 0)[0] == 6 and struct.unpack_from("<i", attr, 8) \
        == (1,)


def test_a_launch_refused_for_another_context_goes_through_the_bindings(driver, monkeypatch):
    """With another context current, libcuda refuses the launch (nothing runs); the launcher
    then makes the module's context current and launches once through the bindings."""
    call = rms_call()
    want = run(call, driver, fast=False)
    lib = FakeLibcuda(current=999, refuse=201)            # CUDA_ERROR_INVALID_CONTEXT
    monkeypatch.setattr(rc, "_RAW", [lib])
    n = len(driver.launches)
    assert run(call, driver, fast=True) == want
    assert len(driver.launches) == n + 1 and not lib.launches


class FakeEncoder:
    """libcuda's cuTensorMapEncodeTiled as TensorMap calls it (C values): writes the map
    FakeDriver writes (the address, then zeros) and records the geometry it was given."""

    def __init__(self):
        self.calls = []

    def __call__(self, out, dt, rank, address, sizes, strides, box, elems, *enums):
        n = rank.value
        self.calls.append((address.value, list(sizes)[:n], list(strides)[:n - 1]))
        ctypes.memmove(out.value, struct.pack("<Q", address.value) + bytes(120), 128)
        return 0


def test_moved_tensors_get_maps_encoded_from_their_address(driver, monkeypatch):
    """A plan re-encodes the tensor map of a tensor that moved through libcuda, from the
    new address and the geometry it recorded once: the launch carries what the checked
    path's maps (through the bindings) would."""
    calls = [gemm_call(seed=s) for s in (0, 1)]
    want = [run(c, driver, fast=False) for c in calls]
    lib, encoder = FakeLibcuda(), FakeEncoder()
    lib.encode_tiled = encoder
    monkeypatch.setattr(rc, "_RAW", [lib])
    got = [run(c, driver, fast=True) and lib.launches[-1] for c in (calls[0], calls[1])]
    assert got == want
    a, b, c = calls[1][1]                      # the second call's tensors: all moved
    encoded = {address: (sizes, strides) for address, sizes, strides in encoder.calls}
    for t in (a, b):
        assert encoded[t.data_ptr()] == (list(reversed(t.shape)), [t.stride(0) * 2])

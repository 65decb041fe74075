"""pykittens.ops on CPU tensors (the library kernels run in the emulator): every op's forward
and backward against torch autograd of a float64 reference, f32 and bf16 (f16 too), at
ragged shapes and (the row ops) rows of 256 to 65536 columns; torch.compile(fullgraph=True)
over a module using them; FakeTensorMode shapes; and the errors for bad inputs."""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import pykittens.ops as pko  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    assert a.shape == b.shape and torch.isfinite(a).all()
    return float((a - b).norm() / b.norm())


def leaves(*shapes, dtype=torch.float32, seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=g) + offset).to(dtype).requires_grad_()
            for s in shapes]


def check_grads(op, ref, inputs, dtype, n_out=1, seed=9):
    """op(*inputs) and ref(*float64 copies) agree, and so do the gradients of a random
    weighting of every output."""
    outs = op(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(o.shape, generator=g) for o in outs]
    sum(((o.float() * w).sum() for o, w in zip(outs, ws))).backward()
    copies = [x.detach().double().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor)
              else x for x in inputs]
    refs = ref(*copies)
    refs = refs if isinstance(refs, tuple) else (refs,)
    sum(((r * w.double()).sum() for r, w in zip(refs, ws))).backward()
    for o, r in zip(outs, refs):
        assert o.dtype == dtype and rel(o, r) < TOL[dtype]
    for x, c in zip(inputs, copies):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            assert x.grad.dtype == x.dtype and rel(x.grad, c.grad) < TOL[dtype]


DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(3, 7, 300), (5, 1500)]          # ragged rows; a row held by one wave, or split


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm(dtype, shape):
    n = shape[-1]
    x, w, b = leaves(shape, (n,), (n,), dtype=dtype, offset=0.5)
    check_grads(lambda x, w, b: pko.layer_norm(x, (n,), w, b),
                lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b), dtype)


def test_layer_norm_of_rows_with_a_large_mean():
    """16-bit rows whose mean is 200 standard deviations, held and walked by the staged
    backward (4096 columns): the backward forms xhat with one fused multiply-add, x rstd -
    mean rstd, whose rounding (about |mean| / std float32 ulps) stays far below bf16's."""
    x, w, b = leaves((4, 4096), (4096,), (4096,), dtype=torch.bfloat16, offset=200.0)
    check_grads(lambda x, w, b: pko.layer_norm(x, (4096,), w, b),
                lambda x, w, b: F.layer_norm(x, (4096,), w, b), (x, w, b), torch.bfloat16)


def test_layer_norm_optional_affine_and_normalized_shape():
    x, w = leaves((4, 5, 60), (5, 60), dtype=torch.bfloat16)
    check_grads(lambda x: pko.layer_norm(x, 60, eps=1e-3),
                lambda x: F.layer_norm(x, (60,), eps=1e-3), (x,), torch.bfloat16)
    x.grad = None
    check_grads(lambda x, w: pko.layer_norm(x, (5, 60), w),       # over the last two dims
                lambda x, w: F.layer_norm(x, (5, 60), w), (x, w), torch.bfloat16)
    x16, b16 = leaves((6, 256), (256,), dtype=torch.float16)
    check_grads(lambda x, b: pko.layer_norm(x, [256], None, b),
                lambda x, b: F.layer_norm(x, [256], None, b), (x16, b16), torch.float16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(dtype, shape):
    n = shape[-1]
    x, w = leaves(shape, (n,), dtype=dtype)
    check_grads(lambda x, w: pko.rms_norm(x, [n], w),
                lambda x, w: F.rms_norm(x, [n], w), (x, w), dtype)   # eps=None: torch's


def test_rms_norm_default_eps_is_torchs_and_weight_is_optional():
    x = torch.full((2, 256), 1e-4)               # mean(x^2) = 1e-8: eps decides the result
    assert torch.allclose(pko.rms_norm(x, (256,)), F.rms_norm(x, (256,)), rtol=1e-6)
    xb = x.bfloat16()
    assert torch.allclose(pko.rms_norm(xb, (256,)).float(), F.rms_norm(xb, (256,)).float(),
                          rtol=1e-2)
    (x,) = leaves((3, 300), dtype=torch.bfloat16)
    check_grads(lambda x: pko.rms_norm(x, 300, eps=1e-6),
                lambda x: F.rms_norm(x, (300,), eps=1e-6), (x,), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm(dtype, shape):
    """Both outputs carry gradient: x and residual get the same one."""
    n = shape[-1]
    x, r, w = leaves(shape, shape, (n,), dtype=dtype)

    def ref(x, r, w):
        s = x + r
        return F.rms_norm(s, (n,), w, 1e-5), s
    check_grads(lambda x, r, w: pko.add_rms_norm(x, r, w, 1e-5), ref, (x, r, w), dtype)
    assert torch.equal(x.grad, r.grad)
    y, s = pko.add_rms_norm(x.detach(), r.detach(), None)
    assert torch.equal(s, x.detach() + r.detach())                 # rounded like torch's sum


def test_unused_outputs_make_no_zero_gradients():
    """The gradient of an output nobody used (the norms' statistics, add_rms_norm's sum)
    reaches the backward as None, not as a tensor of zeros that costs a launch (and, for
    the sum, a full read): no aten zeros in the backward, and the gradients still agree
    with torch's (dx of add_rms_norm when only y is used is rms_norm's of the sum)."""
    from torch.profiler import ProfilerActivity, profile
    x, r, w = leaves((6, 40), (6, 40), (40,), seed=3)
    cases = {
        "layer_norm": (lambda: pko.layer_norm(x, (40,), w, None),
                       lambda xd, wd: F.layer_norm(xd, (40,), wd, None), (x, w)),
        "rms_norm": (lambda: pko.rms_norm(x, (40,), w, 1e-5),
                     lambda xd, wd: F.rms_norm(xd, (40,), wd, 1e-5), (x, w)),
        "add_rms_norm y only": (lambda: pko.add_rms_norm(x, r, w, 1e-5)[0],
                                lambda xd, rd, wd: F.rms_norm(xd + rd, (40,), wd, 1e-5),
                                (x, r, w)),
    }
    for name, (op, ref, inputs) in cases.items():
        y = op()
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            got = torch.autograd.grad(y, inputs, dy)
        made = {e.key for e in prof.key_averages()} & {"aten::zeros", "aten::zeros_like",
                                                        "aten::zero_", "aten::fill_"}
        assert not made, (name, made)
        copies = [t.detach().double().requires_grad_() for t in inputs]
        want = torch.autograd.grad(ref(*copies), copies, dy.double())
        for g, wg in zip(got, want):
            assert rel(g, wg) < 1e-4, name


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
def test_softmax(dtype):
    (x,) = leaves((3, 5, 700), dtype=dtype)
    x.data *= 3
    check_grads(lambda x: pko.softmax(x, dim=-1), lambda x: torch.softmax(x, -1), (x,), dtype)
    assert torch.equal(pko.softmax(x.detach(), 2), pko.softmax(x.detach()))


ROWS = 3              # no multiple of a workgroup's 4 resident rows
ROW_OPS = {           # op: (input shapes for rows of n columns, the op, the torch reference)
    "layer_norm": (lambda n: [(ROWS, n), (n,), (n,)],
                   lambda x, w, b: pko.layer_norm(x, (x.shape[-1],), w, b),
                   lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)),
    "rms_norm": (lambda n: [(ROWS, n), (n,)],
                 lambda x, w: pko.rms_norm(x, (x.shape[-1],), w, 1e-5),
                 lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-5)),
    "add_rms_norm": (lambda n: [(ROWS, n), (ROWS, n), (n,)],
                     lambda x, r, w: pko.add_rms_norm(x, r, w, 1e-5),
                     lambda x, r, w: (F.rms_norm(x + r, (x.shape[-1],), w, 1e-5), x + r)),
    "softmax": (lambda n: [(ROWS, n)], pko.softmax, lambda x: torch.softmax(x, -1)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [256, 4096, 65536])
@pytest.mark.parametrize("op", list(ROW_OPS))
def test_row_ops_from_256_to_65536_columns(op, n, dtype):
    """Each row op forward and backward against float64 autograd at the narrowest and
    widest rows the schedules cover: held by one wave (256), split across waves (4096;
    bf16 65536 across 32), looped (f32 65536)."""
    shapes, fn, ref = ROW_OPS[op]
    check_grads(fn, ref, tuple(leaves(*shapes(n), dtype=dtype, offset=0.5)), dtype)


def rope_reference(x, cos, sin, interleaved, positions=None):
    b, s, h, d = x.shape
    half = cos.shape[1]
    pos = torch.arange(s).expand(b, s) if positions is None else positions.expand(b, s)
    c, sn = (t.double()[pos][:, :, None, :] for t in (cos, sin))
    if interleaved:
        a, bb = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        rot = torch.stack([a * c - bb * sn, bb * c + a * sn], -1).flatten(-2)
    else:
        a, bb = x[..., :half], x[..., half:2 * half]
        rot = torch.cat([a * c - bb * sn, bb * c + a * sn], -1)
    return torch.cat([rot, x[..., 2 * half:]], -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope(dtype, interleaved):
    """Partial rotary (48 of 80 columns), more table rows than positions; with and without
    explicit positions; a strided x (a slice of a fused projection, unit last stride)."""
    (qkv,) = leaves((2, 6, 3, 3, 80), dtype=dtype)
    ang = torch.rand(9, 24, generator=torch.Generator().manual_seed(2)) * 6
    cos, sin = ang.cos(), ang.sin()
    positions = torch.tensor([[0, 3, 8, 1, 2, 2], [5, 4, 3, 2, 1, 0]])
    for pos in (None, positions, torch.arange(6)):
        def op(qkv):
            return pko.rope(qkv[:, :, 0], cos, sin, interleaved, positions=pos)

        def ref(qkv):
            return rope_reference(qkv[:, :, 0], cos, sin, interleaved, pos)
        check_grads(op, ref, (qkv,), dtype)
        qkv.grad = None
    xb = qkv.detach()[:, :, 0].contiguous()
    assert torch.equal(pko.rope(xb, cos.to(dtype), sin.to(dtype), interleaved),
                       pko.rope(xb, cos.to(dtype).float(), sin.to(dtype).float(), interleaved))


@pytest.mark.parametrize("k", [128, 100])      # gemm_ws (TMA rows of 16 bytes) / gemm
def test_linear(k):
    dtype = torch.bfloat16
    x, w, b = leaves((2, 37, k), (70, k), (70,), dtype=dtype)
    w.data /= 8
    check_grads(pko.linear, F.linear, (x, w, b), dtype)
    x.grad = w.grad = None
    check_grads(lambda x, w: pko.linear(x, w), lambda x, w: F.linear(x, w), (x, w), dtype)


def test_linear_backward_reads_operands_as_stored():
    """With rows TMA can copy, the gradients are gemm_ws products of the saved tensors as
    they are (LAYOUT "nn" for dX = dY W, "tn" for dW = dY^T X), not transposed copies."""
    import sys
    M = sys.modules["pykittens.ops.matmul"]        # (pykittens.ops.matmul is the function)
    dtype = torch.bfloat16
    x, w = leaves((2, 24, 128), (72, 128), dtype=dtype)
    w.data /= 8
    check_grads(lambda x, w: pko.linear(x, w), lambda x, w: F.linear(x, w), (x, w), dtype)
    for form, (m, k, n) in (("nt", (48, 128, 72)), ("nn", (48, 72, 128)),
                            ("tn", (72, 48, 128))):
        kernel, _, consts, _ = M._plan("sm_90a", form, m, k, n, 2)
        assert kernel is M.gemm_ws and consts.get("LAYOUT", "nt") == form
    assert M.ws_layout("sm_90a", "tn", 70, 48, 128, 2) == "nt"      # 140-byte rows of dY
    assert M.ws_layout("sm_90a", "nn", 48, 70, 128, 2) is None      # K rows TMA can't copy
    assert M.ws_layout("gfx950", "nn", 48, 64, 128, 2) is None


def test_matmul():
    dtype = torch.float16
    a, b = leaves((3, 20, 96), (96, 40), dtype=dtype)
    b.data /= 8
    check_grads(pko.matmul, torch.matmul, (a, b), dtype)
    a.grad = b.grad = None
    (bt,) = leaves((40, 96), dtype=dtype, seed=1)                 # x @ w.t(): read as stored
    check_grads(lambda a, bt: pko.matmul(a, bt.t()), lambda a, bt: a @ bt.t(), (a, bt), dtype)
    v = torch.randn(96, dtype=dtype)
    assert rel(pko.matmul(v, b.detach()), v.double() @ b.detach().double()) < 1e-2


def test_ops_compile_fullgraph_and_match_eager():
    """A pre-norm block of every op but attention: torch.compile(fullgraph=True) traces it
    in one graph (custom ops, fake impls, autograd) and computes what eager does."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(3)
            self.w = torch.nn.Parameter(torch.randn(128, generator=g).bfloat16())
            self.b = torch.nn.Parameter(torch.randn(128, generator=g).bfloat16())
            self.proj = torch.nn.Parameter((torch.randn(128, 128, generator=g) / 11).bfloat16())
            ang = torch.rand(16, 32, generator=g) * 6
            self.cos, self.sin = ang.cos(), ang.sin()

        def forward(self, x, r):
            h, s = pko.add_rms_norm(x, r, self.w, 1e-5)
            q = pko.rope(h.view(1, 16, 2, 64), self.cos, self.sin).view(1, 16, 128)
            p = pko.softmax(pko.matmul(q[0], self.proj.t()))
            y = pko.linear(pko.layer_norm(p, (128,), self.w, self.b), self.proj, self.b)
            return pko.rms_norm(y, (128,)) + s

    g = torch.Generator().manual_seed(4)
    x, r = (torch.randn(1, 16, 128, generator=g).bfloat16() for _ in range(2))
    results = []
    for model in (Block(), torch.compile(Block(), fullgraph=True)):
        xi = x.clone().requires_grad_()
        y = model(xi, r)
        y.float().square().sum().backward()
        params = model.parameters()
        results.append((y, xi.grad, *(p.grad for p in params)))
    for eager, compiled in zip(*results):
        assert torch.allclose(eager.float(), compiled.float(), rtol=1e-2, atol=1e-2)


def test_fake_tensors_give_shapes_and_gradient_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(2, 33, 4096, dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(4096, dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty(4096, dtype=torch.bfloat16, requires_grad=True)
        out = pko.layer_norm(x, (4096,), w, b) + pko.rms_norm(x, (4096,), w) + \
            pko.softmax(x) + sum(pko.add_rms_norm(x, x, w))
        assert out.shape == x.shape and out.dtype == x.dtype
        out.sum().backward()
        assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape
        q = torch.empty(2, 33, 8, 128, dtype=torch.bfloat16, requires_grad=True)
        cos = torch.empty(40, 64)
        assert pko.rope(q, cos, cos, interleaved=True).shape == q.shape
        pko.rope(q, cos, cos).sum().backward()
        assert q.grad.shape == q.shape
        wl = torch.empty(1000, 4096, dtype=torch.bfloat16, requires_grad=True)
        y = pko.linear(x, wl, None)
        assert y.shape == (2, 33, 1000)
        y.sum().backward()
        assert wl.grad.shape == wl.shape
        assert pko.matmul(x, wl.t()).shape == (2, 33, 1000)


def _meta(t):
    return t.to("meta")


BAD = [
    (lambda x, w: pko.layer_norm(x.double(), (64,)), TypeError,
     "layer_norm: input is torch.float64; the kernels take float32, bfloat16 or float16"),
    (lambda x, w: pko.layer_norm(x, (32,), w), ValueError,
     "normalized_shape [32] must be the last dims of input (4, 64)"),
    (lambda x, w: pko.layer_norm(x, (64,), w[:32]), ValueError,
     "weight has shape (32,) but normalized_shape is [64]"),
    (lambda x, w: pko.layer_norm(x, (64,), w.bfloat16()), TypeError,
     "input is torch.float32 but weight is torch.bfloat16; convert with weight.to(input.dtype)"),
    (lambda x, w: pko.rms_norm(x, (64,), _meta(w)), ValueError,
     "rms_norm: input on cpu, weight on meta; put them on one device"),
    (lambda x, w: pko.rms_norm(x.t(), (4,)), ValueError,
     "rms_norm: input needs a unit stride in its last dim (it has 64); pass input.contiguous()"),
    (lambda x, w: pko.softmax(x, 0), NotImplementedError, "reduce over the last dim, not dim 0"),
    (lambda x, w: pko.softmax(x.tolist()), TypeError, "input must be a torch.Tensor, not list"),
    (lambda x, w: pko.add_rms_norm(x, x[:2], w), ValueError,
     "residual (2, 64) must have x's shape (4, 64)"),
    (lambda x, w: pko.linear(x, x), TypeError, "linear: input is torch.float32; the kernels "
     "take bfloat16 or float16 (convert with .to(torch.bfloat16))"),
    (lambda x, w: pko.linear(x.bfloat16(), x[:, :32].bfloat16().contiguous()), ValueError,
     "input (4, 64) has 64 features but weight (4, 32) takes 32"),
    (lambda x, w: pko.matmul(x.bfloat16(), w.bfloat16()), NotImplementedError,
     "other (64,) must be a matrix (K, N)"),
    (lambda x, w: pko.rope(x, w, w), ValueError, "rope: x must have 4 dims, got 2 (4, 64)"),
    (lambda x, w: pko.rope(x.view(1, 4, 2, 32), w.view(2, 32)[:, :8], w.view(2, 32)[:, :8]),
     ValueError, "cos and sin have 2 rows but x has 4 positions"),
    (lambda x, w: pko.rope(x.view(1, 4, 2, 32), x[:, :20], x[:, :20]), ValueError,
     "rotary_dim = 40; it must be in 1..head_dim (32)"),
    (lambda x, w: pko.rope(x.view(1, 4, 2, 32), x[:, :8], x[:, :8], positions=torch.tensor(
        [0, 1, 2, 9])), ValueError, "positions must index the 4 rows of cos and sin, got 0..9"),
    (lambda x, w: pko.rope(x.view(1, 4, 2, 32), x[:, :8], x[:, :8].double()), TypeError,
     "sin is torch.float64"),
]


@pytest.mark.parametrize("bad,exc,msg", BAD, ids=[m[:40] for _, _, m in BAD])
def test_errors_name_the_argument_and_the_fix(bad, exc, msg):
    x = torch.randn(4, 64)
    w = torch.randn(64)
    with pytest.raises(exc) as e:
        bad(x, w)
    assert msg in str(e.value)


def test_rope_tables_that_want_gradients_are_refused():
    x = torch.randn(1, 4, 2, 32)
    cos = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"no gradient flows to cos; pass cos\.detach"):
        pko.rope(x, cos, cos.detach())
    with torch.no_grad():
        pko.rope(x, cos, cos)


def test_empty_inputs():
    x = torch.empty(0, 7, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, dtype=torch.bfloat16, requires_grad=True)
    y = pko.layer_norm(x, (64,), w) + pko.rms_norm(x, (64,), w) + pko.softmax(x)
    y.sum().backward()
    assert y.shape == x.shape and w.grad.abs().sum() == 0
    assert pko.linear(x, torch.randn(5, 64, dtype=torch.bfloat16)).shape == (0, 7, 5)


def test_a_gpu_that_is_not_cuda_is_named():
    from pykittens.ops.run import target_of
    with pytest.raises(ValueError, match="tensors on meta are not supported"):
        target_of(torch.empty(1, device="meta"))
    assert math.isfinite(1.0)


def test_llama_block_matches_torch_on_cpu():
    """bench/llama_block.py at its CPU size: the block on pykittens.ops (bf16) is as close
    to torch in float64 as torch's own bf16 block, forward and every gradient."""
    from conftest import bench_script
    script = bench_script("llama_block")
    errs = script.compare(script.TINY, "cpu")
    assert set(errs["pykittens"]) == {"y", "dx", "dnorm1", "dnorm2", "dwqkv", "dwo", "dw13",
                                      "dw2"}
    for name, e in errs["pykittens"].items():
        assert e < 2e-2 and e < 1.5 * errs["torch"][name], (name, e, errs["torch"][name])


def test_eager_calls_and_the_custom_op_agree():
    """An eager call runs the op's function directly (ops.run.CustomOp), through an
    autograd.Function with the registered formula; the registered custom op (what
    torch.compile traces) gives the same bits, forward and backward, and passes torch's
    own checks of its schema, fake and autograd registration (torch.library.opcheck)."""
    from pykittens.ops.norms import _add_rms_norm
    x, r, w = leaves((6, 300), (6, 300), (300,), dtype=torch.bfloat16)
    dys = [torch.randn(6, 300).bfloat16(), torch.randn(6, 300).bfloat16()]
    got = {}
    for path, fn in (("eager", _add_rms_norm), ("op", _add_rms_norm.op)):
        leaves_ = [t.detach().requires_grad_() for t in (x, r, w)]
        y, s, _ = fn(*leaves_, 1e-6)
        grads = torch.autograd.grad((y, s), leaves_, dys)
        got[path] = (y, s) + grads
    for a, b in zip(got["eager"], got["op"]):
        assert torch.equal(a, b)
    torch.library.opcheck(_add_rms_norm.op, (x.detach(), r.detach(), w.detach(), 1e-6),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))


def test_dispatch_modes_see_the_custom_op():
    """Under a TorchDispatchMode (profilers, flop counters) the op stays one custom op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(4, 256), torch.randn(256)
    with Seen():
        pko.rms_norm(x, (256,), w)
    assert any("pykittens.rms_norm" in n for n in Seen.names), Seen.names

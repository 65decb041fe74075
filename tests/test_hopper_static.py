"""CI's static checks on real sm_90a cubins (LLVM's NVPTX backend, then ptxas; SASS through
cuobjdump/nvdisasm, all installed by install.sh): every library kernel builds without
spills or stack, and its matrix multiplies are the tensor-core instructions meant: wgmma
(HGMMA / QGMMA) in the main loop where `mma` reads b from shared memory, HMMA for the
warp-level mma.sync."""
import pytest

from pykittens import compiler
from pykittens.ir import types as T
from pykittens.ir.nodes import walk
from pykittens.kernels import KERNELS

from conftest import needs_sass

pytestmark = pytest.mark.usefixtures("module_cache")

HOPPER = sorted(n for n, s in KERNELS.items() if "sm_90a" in s.targets)
# further configurations the library launches (fp8 operands, persistent, TMA-store epilogue)
VARIANTS = [(n, KERNELS[n].compile_consts) for n in HOPPER] + [
    ("gemm_ws", {"DT": "e4m3", "OUT": "f32", "PERSISTENT": 1, "TM": 32, "TN": 16}),
    ("gemm_ws", {"DT": "bf16", "OUT": "bf16", "PERSISTENT": 1, "TM": 32, "TN": 16,
                 "TMA_STORE": 1, "STAGES": 3}),
    ("gemm_ws", {"DT": "e4m3", "OUT": "f32", "PERSISTENT": 1, "TM": 32, "TN": 32,
                 "BN": 128, "PROMOTE": 1, "STAGES": 3}),
    ("gemm_ws", {"DT": "e4m3", "OUT": "bf16", "PERSISTENT": 1, "TM": 32, "TN": 32,
                 "BN": 128, "PROMOTE": 1, "TMA_STORE": 1, "STAGES": 4}),
]


def _matrix_ops(kernel, consts):
    """'wgmma' / 'mma.sync' for each mma in the kernel: wgmma when b is a shared tile."""
    ops = [op for op in walk(compiler.tile_ir(kernel, "sm_90a", **consts).body) if op.kind == "mma"]
    return {"wgmma" if isinstance(op.srcs[1].type, T.SharedTileType) else "mma.sync"
            for op in ops}


@pytest.mark.parametrize("name,consts", VARIANTS,
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in c.items())}"
                              for n, c in VARIANTS])
@needs_sass
def test_library_kernel_cubin(name, consts):
    kernel = KERNELS[name].kernel
    rep = compiler.report(kernel, "sm_90a", **consts)
    assert rep["notes"] == [], rep["notes"]                   # ptxas and SASS tools ran
    assert rep["spill_bytes"] == 0 and rep["stack_bytes"] == 0, rep
    assert 0 < rep["registers"] <= 255
    mix, kinds = rep["sass_mix"], _matrix_ops(kernel, consts)
    fp8 = T.dtype_of(consts.get("DT", "bf16")).bits == 8
    if "wgmma" in kinds:
        assert rep["loop_wgmma"] > 0, rep
        assert mix.get("QGMMA" if fp8 else "HGMMA", 0) > 0 and \
            mix.get("HGMMA" if fp8 else "QGMMA", 0) == 0, mix
    else:
        assert rep["loop_wgmma"] == 0 and "HGMMA" not in mix and "QGMMA" not in mix
    if "mma.sync" in kinds:
        assert mix.get("HMMA", 0) > 0, mix
    assert kinds or name not in ("gemm", "gemm_wgmma", "gemm_ws")

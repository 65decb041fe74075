from .errors import KernelError, NotSupportedYet
from .nodes import Block, KernelIR, Loc, Op, Param, Value, walk
from .types import (DTYPES, DType, GlobalType, RegTileType, RegVecType, ScalarType,
                    SharedTileType, dtype_of)

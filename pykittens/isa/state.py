"""Architectural state of a wave and the memories it addresses: what every instruction's
semantics read and write.

A wave (CDNA3 ISA, ch. 3 "Kernel State"): 64 lanes; SGPRs s0..s101 plus VCC, M0 and EXEC,
kept in one array indexed by their operand encodings (vcc = 106/107, m0 = 124,
exec = 126/127) so a 64-bit SGPR-pair write to `exec` is an ordinary write; SCC; a unified
vector register file of 512 32-bit registers per lane, v0..v255 then a0..a255 (CDNA3 ISA,
"Vector registers": AGPRs are the second half of the unified file on gfx90a and later).
"""
from __future__ import annotations

import bisect

import numpy as np

from .decode import AGPR_BASE, EXEC, VCC

LANES = 64
_BIT = np.uint64(1) << np.arange(LANES, dtype=np.uint64)


class ISAError(RuntimeError):
    """The code object did something the ISA forbids or leaves undefined (an address
    outside every allocation, a wait-state hazard, a register read before its load
    returned), or used an instruction the emulator does not know."""


_MASKS: dict[int, np.ndarray] = {}


def lanes_of(bits: int) -> np.ndarray:
    """The 64-lane boolean mask of a 64-bit lane mask (bit i = lane i), memoised: kernels
    use few distinct masks."""
    m = _MASKS.get(bits)
    if m is None:
        if len(_MASKS) > 4096:
            _MASKS.clear()
        m = (np.uint64(bits) & _BIT) != 0
        m.flags.writeable = False
        _MASKS[bits] = m
    return m


def bits_of(mask: np.ndarray) -> int:
    return int(np.packbits(mask, bitorder="little").view("<u8")[0])


class Wave:
    """One wave's registers and program counter; `exec` mirrors s[126:127] as a lane
    mask (update it with `exec_changed` after writing either)."""

    def __init__(self, wave_id: int, workgroup):
        self.id = wave_id
        self.wg = workgroup
        self.s = [0] * 256
        self.scc = 0
        self.v = np.zeros((2 * AGPR_BASE, LANES), np.uint32)
        self.pc = 0
        self.done = False
        self.at_barrier = False
        self.prio = 0                    # s_setprio's level (no effect on results)
        self.set_exec((1 << LANES) - 1)

    # -- EXEC and VCC ------------------------------------------------------------------------
    def set_exec(self, bits: int):
        self.s[EXEC] = bits & 0xFFFFFFFF
        self.s[EXEC + 1] = (bits >> 32) & 0xFFFFFFFF
        self.exec_changed()

    def exec_changed(self):
        bits = self.s[EXEC] | (self.s[EXEC + 1] << 32)
        self.exec_bits = bits
        self.exec = lanes_of(bits)
        self.exec_all = bits == (1 << LANES) - 1

    def sgpr64(self, r: int) -> int:
        return self.s[r] | (self.s[r + 1] << 32)

    def vcc_mask(self) -> np.ndarray:
        return lanes_of(self.s[VCC] | (self.s[VCC + 1] << 32))

    def write_sgpr(self, r: int, value: int, n: int = 1):
        for i in range(n):
            self.s[r + i] = (value >> (32 * i)) & 0xFFFFFFFF
        if r + n > EXEC and r <= EXEC + 1:
            self.exec_changed()

    # -- vector registers ------------------------------------------------------------------------
    def write_v(self, r: int, value):
        """Lanes in EXEC of register r (unified index) := value (uint32 array or scalar)."""
        if self.exec_all:
            self.v[r] = value
        else:
            np.copyto(self.v[r], value, where=self.exec, casting="unsafe")


class Memory:
    """Global memory: allocations at emulated 64-bit addresses, each a byte array. An
    access must fall inside one allocation; anything else is an error naming the
    address, as a GPU page fault would be."""

    BASE = 0x7F00_0000_0000
    ALIGN = 1 << 16

    def __init__(self):
        self.starts: list[int] = []
        self.allocs: list[tuple[int, np.ndarray, str]] = []
        self.next = self.BASE

    def alloc(self, nbytes: int, name: str) -> int:
        data = np.zeros(max(nbytes, 1), np.uint8)
        addr = self.next
        self.next += -(-max(nbytes, 1) // self.ALIGN) * self.ALIGN + self.ALIGN   # guard gap
        self.starts.append(addr)
        self.allocs.append((addr, data, name))
        return addr

    def region(self, addr: int) -> tuple[int, np.ndarray, str]:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0:
            base, data, name = self.allocs[i]
            if addr < base + len(data):
                return self.allocs[i]
        raise ISAError(f"address 0x{addr:x} is not inside any allocation")

    def read_bytes(self, addr: int, n: int) -> bytes:
        base, data, name = self.region(addr)
        if addr + n > base + len(data):
            raise ISAError(f"a {n}-byte read at 0x{addr:x} runs past the end of {name} "
                           f"(0x{base:x} + {len(data)} bytes)")
        return data[addr - base:addr - base + n].tobytes()

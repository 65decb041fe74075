"""Memory instructions: scalar loads (SMEM), buffer loads and stores (MUBUF, including the
loads straight into LDS) and the data share (DS).

Sources: AMD Instinct MI300 (CDNA3) ISA Reference Guide, chapters "Scalar Memory
Operations", "Vector Memory Operations" (buffer instructions: the V# resource, address
computation, range checking, loads into LDS) and "Data Share Operations" (LDS
addressing, DS_SWIZZLE_B32, DS_PERMUTE/BPERMUTE_B32), and the instructions' pseudocode;
the CDNA4 guide for gfx950's 12- and 16-byte loads into LDS and DS_READ_B64_TR_B16
("MFMA Transpose Load from LDS").

Every access completes when it issues; the wave's wait counters (machine.Waits) record
what a real wave would still have in flight, so a register read before its s_waitcnt is
reported.
"""
from __future__ import annotations

import re

import numpy as np

from .operands import ssrc, vsrc
from .state import LANES, ISAError

U32 = np.uint32
_LANE = np.arange(LANES)

# bytes per element and element count of each load/store width
_BUF = {"dword": (4, 1), "dwordx2": (4, 2), "dwordx3": (4, 3), "dwordx4": (4, 4),
        "ubyte": (1, 1), "sbyte": (1, 1), "ushort": (2, 1), "sshort": (2, 1),
        "byte": (1, 1), "short": (2, 1), "short_d16": (2, 1), "short_d16_hi": (2, 1),
        "ubyte_d16": (1, 1), "ubyte_d16_hi": (1, 1), "sbyte_d16": (1, 1),
        "sbyte_d16_hi": (1, 1), "byte_d16_hi": (1, 1)}


def _gather(data: np.ndarray, addr: np.ndarray, nbytes: int) -> np.ndarray:
    """Bytes [addr, addr + nbytes) of `data` per lane -> (lanes, nbytes) uint8."""
    return data[addr[:, None] + np.arange(nbytes)]


def _to_dwords(raw: np.ndarray) -> np.ndarray:
    """(lanes, 4k) bytes -> (k, lanes) little-endian dwords."""
    return np.ascontiguousarray(raw).view("<u4").T


def _widen(raw: np.ndarray, esz: int, signed: bool) -> np.ndarray:
    v = np.ascontiguousarray(raw).view({1: "<u1", 2: "<u2"}[esz])[:, 0].astype(U32)
    if signed:
        top = U32(1 << (8 * esz - 1))
        v = (v ^ top) - top
    return v


# ----------------------------------------------------------------------------- SMEM

def compile_smem(inst, ctx):
    """S_LOAD_DWORD{,X2,X4,X8,X16} sdst, sbase, offset: sdst = MEM[sbase + offset];
    S_MEMREALTIME sdst: the 64-bit real-time counter (the emulator's: the count of reads
    of it before this one in the dispatch, as the lane emulator counts pk.timestamp's)."""
    if inst.op == "s_memrealtime":
        dst = inst.ops[0].reg

        def memrealtime(w):
            run = w.wg.run
            w.s[dst], w.s[dst + 1] = run.realtime & 0xFFFFFFFF, run.realtime >> 32
            run.realtime += 1
            w.wg.waits.issue(w, "lgkm", (512 + dst, 513 + dst), smem=True, inst=inst)
        return memrealtime
    m = re.fullmatch(r"s_load_dword(x(\d+))?", inst.op)
    if not m:
        return None
    n = int(m.group(2) or 1)
    dst, base, off = inst.ops[0], inst.ops[1].reg, inst.ops[2]
    offset = ssrc(off)
    regs = tuple(range(512 + dst.reg, 512 + dst.reg + n))

    def s_load(w):
        addr = (w.s[base] | (w.s[base + 1] << 32)) + (offset(w) if off.kind == "s"
                                                      else _simm21(off.value))
        raw = w.wg.mem.read_bytes(addr & ((1 << 64) - 1), 4 * n)
        vals = np.frombuffer(raw, "<u4")
        for i in range(n):
            w.s[dst.reg + i] = int(vals[i])
        if dst.reg <= 127 <= dst.reg + n:
            w.exec_changed()
        w.wg.waits.issue(w, "lgkm", regs, smem=True, inst=inst)
    return s_load


def _simm21(v: int) -> int:
    v &= (1 << 21) - 1
    return v - (1 << 21) if v >> 20 else v


# ----------------------------------------------------------------------------- MUBUF

class BufferResource:
    """The fields of a V# the emulator uses (ISA, "Buffer Resource"): base address
    [47:0], stride [61:48], swizzle enable [63], num_records [95:64], add_tid_enable
    [119]."""

    def __init__(self, words):
        w0, w1, w2, w3 = words
        self.base = w0 | ((w1 & 0xFFFF) << 32)
        self.stride = (w1 >> 16) & 0x3FFF
        self.swizzle = (w1 >> 31) & 1
        self.num_records = w2
        self.add_tid = (w3 >> 23) & 1


def compile_mubuf(inst, ctx):
    if inst.op == "buffer_atomic_add_f32":
        return _compile_atomic_add_f32(inst)
    m = re.fullmatch(r"buffer_(load|store)_(\w+)", inst.op)
    if not m or m.group(2) not in _BUF:
        return None
    store = m.group(1) == "store"
    kind = m.group(2)
    esz, count = _BUF[kind]
    nbytes = esz * count
    lds = bool(inst.mods.get("lds"))
    ops = list(inst.ops)
    if lds:
        vdata = None
        vaddr, rsrc, soff = ops
    else:
        vdata, vaddr, rsrc, soff = ops
    offen, idxen = bool(inst.mods.get("offen")), bool(inst.mods.get("idxen"))
    if idxen:
        raise ISAError(f"{inst.where()}: indexed (idxen) buffer accesses are not emulated")
    inst_off = int(inst.mods.get("offset", 0))
    voff = vsrc(vaddr) if offen else None
    soffset = ssrc(soff)
    r = rsrc.reg
    signed = kind.startswith("s") and not kind.startswith("short")
    d16_hi = kind.endswith("_d16_hi")
    d16 = "_d16" in kind
    dregs = () if (store or lds) else tuple(range(vdata.reg, vdata.reg + vdata.n))

    def address(w):
        res = BufferResource([w.s[r + i] for i in range(4)])
        if res.stride or res.swizzle or res.add_tid:
            raise ISAError(f"{inst.where()}: only raw buffers (stride 0, no swizzle, no "
                           "add_tid) are emulated")
        off = (np.broadcast_to(np.asarray(voff(w), np.int64), (LANES,)) if offen
               else np.zeros(LANES, np.int64)) + inst_off
        # ISA "Range Checking", raw buffer: each element is in range when its offset
        # (vgpr offset + instruction offset; the SGPR offset is not included) is below
        # num_records.
        elem = off[:, None] + esz * np.arange(count)
        ok = (elem + esz <= res.num_records) & w.exec[:, None]
        return res, off + soffset(w), ok

    def region(w, res, off, ok):
        if not ok.any():
            return None, None
        base, data, name = w.wg.mem.region(res.base)
        start = res.base - base + off
        hi = start[ok.any(1)].max() + nbytes
        if hi > len(data) or start[ok.any(1)].min() < 0:
            raise ISAError(f"{inst.where()}: buffer access at 0x{res.base:x}+"
                           f"{int(off[ok.any(1)].max())} is within num_records "
                           f"({res.num_records}) but outside {name} ({len(data)} bytes): "
                           "the V# is wrong")
        return data, start

    if store:
        vd = [vsrc(vdata, part=i) for i in range(max(1, nbytes // 4))]

        def buffer_store(w):
            res, off, ok = address(w)
            data, start = region(w, res, off, ok)
            if data is None:
                return
            if esz == 4:
                vals = np.stack([np.broadcast_to(np.asarray(f(w), U32), (LANES,)) for f in vd], 1)
                raw = np.ascontiguousarray(vals.astype("<u4")).view(np.uint8).reshape(LANES, nbytes)
            else:
                v = np.broadcast_to(np.asarray(vd[0](w), U32), (LANES,))
                if d16_hi:
                    v = v >> U32(16)
                raw = np.ascontiguousarray(v.astype("<u4")).view(np.uint8)
                raw = raw.reshape(LANES, 4)[:, :esz]
            okb = np.repeat(ok, esz, axis=1)
            idx = start[:, None] + np.arange(nbytes)
            data[idx[okb]] = raw[okb]
            w.wg.waits.issue(w, "vm", (), inst=inst)
        return buffer_store

    if lds:
        def buffer_load_lds(w):
            # ISA, buffer loads into LDS: lane i's data lands at M0 + inst_offset + i * size
            res, off, ok = address(w)
            data, start = region(w, res, off, ok)
            raw = np.zeros((LANES, nbytes), np.uint8)
            if data is not None:
                okb = np.repeat(ok, esz, axis=1)
                idx = start[:, None] + np.arange(nbytes)
                raw[okb] = data[idx[okb]]
            base = (w.s[124] + inst_off) & 0xFFFFFFFF
            dst = base + _LANE * nbytes
            lanes = w.exec
            w.wg.lds_write(w, dst[lanes], raw[lanes], inst)
            w.wg.waits.issue(w, "vm", (), inst=inst, lds=(base, LANES * nbytes))
        return buffer_load_lds

    def buffer_load(w):
        res, off, ok = address(w)
        data, start = region(w, res, off, ok)
        raw = np.zeros((LANES, max(nbytes, 4)), np.uint8)
        if data is not None:
            okb = np.repeat(ok, esz, axis=1)
            idx = start[:, None] + np.arange(nbytes)
            sub = raw[:, :nbytes]
            sub[okb] = data[idx[okb]]
        if esz == 4:
            dw = _to_dwords(raw[:, :nbytes])
            for i in range(count):
                w.write_v(vdata.reg + i, dw[i])
        else:
            v = _widen(raw[:, :esz], esz, signed)
            if d16:
                old = w.v[vdata.reg]
                v = ((old & U32(0xFFFF)) | (v << U32(16))) if d16_hi else \
                    ((old & U32(0xFFFF0000)) | (v & U32(0xFFFF)))
            w.write_v(vdata.reg, v)
        w.wg.waits.issue(w, "vm", dregs, inst=inst)
    return buffer_load


# ----------------------------------------------------------------------------- DS

_DS_RW = re.compile(r"ds_(read|write)(2st64|2)?_(b32|b64|b96|b128|u8|i8|u16|i16|b8|b16)"
                    r"(_d16_hi|_d16)?")
_DS_SIZE = {"b32": 4, "b64": 8, "b96": 12, "b128": 16, "u8": 1, "i8": 1, "u16": 2,
            "i16": 2, "b8": 1, "b16": 2}


def _swizzle_offset(text) -> int:
    """The 16-bit DS_SWIZZLE offset of LLVM's `swizzle(...)` syntax (AMDGPUUsage,
    "swizzle pattern"): QUAD_PERM -> offset[15] = 1, lane selects in [7:0]; otherwise
    bit mode: and_mask [4:0], or_mask [9:5], xor_mask [14:10] (SWAP: xor = n;
    REVERSE: xor = n - 1; BROADCAST: and = ~(n - 1), or = lane; BITMASK_PERM: one
    character per lane-id bit, most significant first: 0, 1, p(reserve), i(nvert))."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"swizzle\((\w+),?(.*)\)", text)
    if not m:
        raise ISAError(f"cannot read the ds_swizzle offset {text!r}")
    mode, args = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
    if mode == "QUAD_PERM":
        p = [int(a) for a in args]
        return 0x8000 | p[0] | p[1] << 2 | p[2] << 4 | p[3] << 6
    and_m, or_m, xor_m = 0x1F, 0, 0
    if mode == "SWAP":
        xor_m = int(args[0])
    elif mode == "REVERSE":
        xor_m = int(args[0]) - 1
    elif mode == "BROADCAST":
        size, lane = int(args[0]), int(args[1])
        and_m, or_m = 0x1F & ~(size - 1), lane
    elif mode == "BITMASK_PERM":
        pat = args[0].strip('"')
        and_m = or_m = xor_m = 0
        for i, ch in enumerate(reversed(pat)):
            bit = 1 << i
            if ch == "1":
                or_m |= bit
            elif ch == "p":
                and_m |= bit
            elif ch == "i":
                and_m |= bit
                xor_m |= bit
    else:
        raise ISAError(f"ds_swizzle mode {mode} is not emulated")
    return and_m | or_m << 5 | xor_m << 10


def swizzle_sources(offset: int) -> np.ndarray:
    """Source lane of each lane for DS_SWIZZLE_B32 (its pseudocode): offset[15] set ->
    full sharing within groups of 4 lanes; else bit mode within groups of 32:
    j = ((i & and) | or) ^ xor."""
    lane = _LANE
    if offset & 0x8000:
        sel = np.array([(offset >> (2 * k)) & 3 for k in range(4)])
        return (lane & ~3) + sel[lane & 3]
    if offset >= 0xC000:
        raise ISAError("ds_swizzle rotate/FFT modes are not emulated")
    and_m, or_m, xor_m = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    return ((((lane & 0x1F) & and_m) | or_m) ^ xor_m) | (lane & 0x20)


def tr16_sources() -> tuple[np.ndarray, np.ndarray]:
    """DS_READ_B64_TR_B16 (CDNA4 ISA, "MFMA Transpose Load from LDS"): each lane reads
    64 bits (four 16-bit elements); in each group of 16 lanes the 64 elements, in (lane,
    element) order, are
    a 4 x 16 matrix, and the instruction returns its transpose: lane i of the group
    gets column i, element j from row j, i.e. from lane 4j + i // 4, element i % 4.
    Returns (source lane, source element) per (lane, element)."""
    lane, j = np.meshgrid(_LANE, np.arange(4), indexing="ij")
    i = lane & 15
    return (lane & ~15) + 4 * j + i // 4, i % 4


def _lds_addr(vaddr, offset) -> np.ndarray:
    """LDS addressing (ISA, "Data Share Operations"): the 32-bit sum of the address VGPR
    and the instruction's unsigned offset (it wraps: code may put a negative base in the
    VGPR)."""
    return (np.broadcast_to(np.asarray(vaddr, np.int64), (LANES,)) + int(offset)) & 0xFFFFFFFF


def compile_ds(inst, ctx):
    op, ops = inst.op, inst.ops
    off = inst.mods.get("offset", 0)
    if inst.mods.get("gds"):
        raise ISAError(f"{inst.where()}: GDS accesses are not emulated")
    if op == "ds_swizzle_b32":
        src = swizzle_sources(_swizzle_offset(off))
        d, rd = ops[0].reg, vsrc(ops[1])

        def ds_swizzle(w):
            v = np.broadcast_to(rd(w), (LANES,))[src]
            valid = w.exec[src]                  # a disabled source lane reads 0
            w.write_v(d, np.where(valid, v, 0).astype(U32))
            w.wg.waits.issue(w, "lgkm", (d,), inst=inst)
        return ds_swizzle
    if op in ("ds_bpermute_b32", "ds_permute_b32"):
        d, addr, data = ops[0].reg, vsrc(ops[1]), vsrc(ops[2])
        back = op == "ds_bpermute_b32"

        def ds_permute(w):
            lane = ((np.asarray(addr(w), np.int64) + int(off)) // 4) % 64
            lane = np.broadcast_to(lane, (LANES,))
            v = np.broadcast_to(data(w), (LANES,))
            if back:                             # dst[i] = src[lane[i]] if that lane is on
                out = np.where(w.exec[lane], v[lane], 0).astype(U32)
            else:                                # dst[lane[i]] = src[i]; highest lane wins
                out = np.zeros(LANES, U32)
                act = np.nonzero(w.exec)[0]
                out[lane[act]] = v[act]
            w.write_v(d, out)
            w.wg.waits.issue(w, "lgkm", (d,), inst=inst)
        return ds_permute
    if op == "ds_read_b64_tr_b16":
        src_lane, src_elem = tr16_sources()
        d, addr = ops[0].reg, vsrc(ops[1])

        def ds_read_tr(w):
            a = _lds_addr(addr(w), off)
            touched: list = []
            raw = w.wg.lds_read(w, a, 8, inst, touched)            # (lanes, 8) bytes
            h = np.ascontiguousarray(raw).view("<u2")              # (lanes, 4) halves
            t = h[src_lane, src_elem]                              # (lanes, 4)
            for k in range(2):
                w.write_v(d + k, t[:, 2 * k].astype(U32) | (t[:, 2 * k + 1].astype(U32) << 16))
            w.wg.waits.issue(w, "lgkm", (d, d + 1), inst=inst, ds=(touched[0], False))
        return ds_read_tr
    m = _DS_RW.fullmatch(op)
    if not m:
        return None
    rw, two, typ, d16 = m.groups()
    size = _DS_SIZE[typ]
    if two:
        scale = size * (64 if two == "2st64" else 1)
        offs = [int(inst.mods.get("offset0", 0)) * scale, int(inst.mods.get("offset1", 0)) * scale]
    else:
        offs = [int(off)]
    if rw == "read":
        d, addr = ops[0].reg, vsrc(ops[1])
        n_words = max(1, size // 4)
        regs = tuple(range(d, d + n_words * len(offs)))

        def ds_read(w):
            base = _lds_addr(addr(w), 0)          # before any result lands (it may be v_addr)
            reg = d
            touched: list = []
            for o in offs:
                raw = w.wg.lds_read(w, (base + o) & 0xFFFFFFFF, size, inst, touched)
                if size >= 4:
                    for k, dw in enumerate(_to_dwords(raw)):
                        w.write_v(reg + k, dw)
                    reg += n_words
                else:
                    v = _widen(raw, size, typ.startswith("i"))
                    if d16:
                        old = w.v[d]
                        v = ((old & U32(0xFFFF)) | (v << U32(16))) if d16 == "_d16_hi" else \
                            ((old & U32(0xFFFF0000)) | (v & U32(0xFFFF)))
                    w.write_v(d, v)
            w.wg.waits.issue(w, "lgkm", regs, inst=inst, ds=(np.concatenate(touched), False))
        return ds_read
    addr = vsrc(ops[0])
    n_words = max(1, size // 4)
    datas = [[vsrc(data, part=k) for k in range(n_words)] for data in ops[1:]]

    def ds_write(w):
        touched: list = []
        for o, data in zip(offs, datas):
            vals = np.stack([np.broadcast_to(np.asarray(f(w), U32), (LANES,)) for f in data], 1)
            if size < 4:
                if d16 == "_d16_hi":
                    vals = vals >> U32(16)
                raw = np.ascontiguousarray(vals.astype("<u4")).view(np.uint8)[:, :size]
            else:
                raw = np.ascontiguousarray(vals.astype("<u4")).view(np.uint8)
            lanes = w.exec
            w.wg.lds_write(w, _lds_addr(addr(w), o)[lanes], raw[lanes], inst, touched)
        w.wg.waits.issue(w, "lgkm", (), inst=inst, ds=(np.concatenate(touched), True))
    return ds_write


def _compile_atomic_add_f32(inst):
    """BUFFER_ATOMIC_ADD_F32 (CDNA3 ISA, "MUBUF Instructions"; raw buffer, no return
    value without GLC): each active lane in range adds its f32 to the dword at its offset,
    lanes in turn (lane order: one fixed order among those the hardware may take)."""
    if inst.mods.get("glc") or inst.mods.get("idxen"):
        raise ISAError(f"{inst.where()}: returning or indexed buffer atomics are not emulated")
    vdata, vaddr, rsrc, soff = inst.ops
    offen = bool(inst.mods.get("offen"))
    inst_off = int(inst.mods.get("offset", 0))
    voff, soffset, val = (vsrc(vaddr) if offen else None), ssrc(soff), vsrc(vdata)
    r = rsrc.reg

    def atomic_add(w):
        res = BufferResource([w.s[r + i] for i in range(4)])
        off = (np.broadcast_to(np.asarray(voff(w), np.int64), (LANES,)) if offen
               else np.zeros(LANES, np.int64)) + inst_off
        ok = (off + 4 <= res.num_records) & w.exec
        if ok.any():
            base, data, name = w.wg.mem.region(res.base)
            start = res.base - base + off + soffset(w)
            words = np.broadcast_to(np.asarray(val(w), U32), (LANES,)).view(np.float32)
            for lane in np.flatnonzero(ok):
                cell = data[start[lane]:start[lane] + 4].view(np.float32)
                cell[0] = np.float32(cell[0] + words[lane])
        w.wg.waits.issue(w, "vm", (), inst=inst)
    return atomic_add

"""Memory instructions on hand-computed values: buffer loads/stores through a V# with
num_records range checking (CDNA3 ISA 9.1), loads into LDS, scalar loads, the LDS
instructions including the cross-lane ones (12.13 DS_SWIZZLE_B32, DS_BPERMUTE_B32;
CDNA4 11.4 DS_READ_B64_TR_B16), and the wait counters."""
import numpy as np
import pytest

from pykittens.isa import ISAError
from pykittens.isa.state import Memory
from isa_helpers import LANE, execute, f32, mask, u32

M32 = 0xFFFFFFFF


def buffer(data: np.ndarray, num_records: int | None = None):
    """(memory, SGPRs s4..s7 of a raw V# over `data`)."""
    mem = Memory()
    raw = np.ascontiguousarray(data).view(np.uint8)
    addr = mem.alloc(len(raw), "buf")
    mem.region(addr)[1][:len(raw)] = raw
    n = len(raw) if num_records is None else num_records
    return mem, {4: addr & M32, 5: addr >> 32, 6: n, 7: 0x00020000}


def test_buffer_load_range_check_and_offsets():
    data = np.arange(100, dtype=np.uint32) * 3
    mem, s = buffer(data, num_records=40 * 4)             # only the first 40 dwords
    off = LANE * 4
    w = execute(["buffer_load_dword v1, v0, s[4:7], 0 offen",
                 "buffer_load_dword v2, v0, s[4:7], 0 offen offset:8",
                 "s_waitcnt vmcnt(0)"], v={0: off}, s=s, mem=mem)
    assert np.array_equal(u32(w, 1), np.where(LANE < 40, LANE * 3, 0))     # 40.. read 0
    assert np.array_equal(u32(w, 2), np.where(LANE + 2 < 40, (LANE + 2) * 3, 0))


def test_buffer_sub_dword_loads_extend():
    data = np.array([0x80, 0x7F, 0xFE, 0x01] * 16, np.uint8)
    mem, s = buffer(data)
    w = execute(["buffer_load_ubyte v1, v0, s[4:7], 0 offen",
                 "buffer_load_sbyte v2, v0, s[4:7], 0 offen",
                 "buffer_load_ushort v3, v0, s[4:7], 0 offen",
                 "s_waitcnt vmcnt(0)"], v={0: LANE % 4 & ~1}, s=s, mem=mem)
    b = data[LANE % 4 & ~1]
    assert np.array_equal(u32(w, 1), b)
    assert np.array_equal(u32(w, 2).view(np.int32), b.view(np.int8).astype(np.int32))
    assert np.all(u32(w, 3)[LANE % 4 < 2] == 0x7F80)


def test_buffer_stores_drop_out_of_range_and_inactive_lanes():
    data = np.zeros(64, np.uint32)
    mem, s = buffer(data, num_records=32 * 4)
    base = s[4] | (s[5] << 32)
    execute(["buffer_store_dword v1, v0, s[4:7], 0 offen",
             "buffer_store_short_d16_hi v2, v3, s[4:7], 0 offen"],
            v={0: LANE * 4, 1: LANE + 1, 2: 0xBEEF0000, 3: 33 * 4}, s=s, mem=mem,
            exec_mask=mask(range(0, 64, 2)))
    got = mem.region(base)[1][:256].view(np.uint32)
    want = np.where((LANE < 32) & (LANE % 2 == 0), LANE + 1, 0)
    assert np.array_equal(got, want)                      # lane 33's short store: dropped


def test_buffer_wide_loads_and_stores():
    data = np.arange(256, dtype=np.uint32)
    mem, s = buffer(data)
    w = execute(["buffer_load_dwordx4 v[2:5], v0, s[4:7], 0 offen", "s_waitcnt vmcnt(0)",
                 "buffer_store_dwordx2 v[3:4], v1, s[4:7], 0 offen"],
                v={0: LANE * 16, 1: 512 + LANE * 8}, s=s, mem=mem)
    for k in range(4):
        assert np.array_equal(u32(w, 2 + k), 4 * LANE + k)
    base = s[4] | (s[5] << 32)
    got = mem.region(base)[1][512:1024].view(np.uint32).reshape(64, 2)
    assert np.array_equal(got, np.stack([4 * LANE + 1, 4 * LANE + 2], 1))


@pytest.mark.parametrize("target,op,size", [("gfx942", "buffer_load_dword", 4),
                                            ("gfx950", "buffer_load_dwordx4", 16)])
def test_buffer_load_into_lds(target, op, size):
    """9.1.10: lane i's data lands at M0 + instruction offset + i * size, whatever the
    lane's global address."""
    data = np.arange(2048, dtype=np.uint32)
    mem, s = buffer(data)
    lds = np.zeros(64 * size + 64, np.uint8)
    w = execute(["s_mov_b32 m0, s8", "s_nop 0", f"{op} v0, s[4:7], 0 offen lds",
                 "s_waitcnt vmcnt(0)"], target, v={0: (63 - LANE) * size}, s={**s, 8: 64},
                mem=mem, lds=lds)
    got = w.wg.lds[64:].view(np.uint32).reshape(64, size // 4)
    want = data.reshape(-1, size // 4)[63 - LANE]
    assert np.array_equal(got, want)


def test_scalar_load():
    data = np.array([11, 22, 33, 44], np.uint32)
    mem, s = buffer(data)
    w = execute(["s_load_dwordx2 s[10:11], s[4:5], 0x4", "s_waitcnt lgkmcnt(0)"], s=s, mem=mem)
    assert (w.s[10], w.s[11]) == (22, 33)


# ---- LDS ---------------------------------------------------------------------------------------

def test_lds_reads_and_writes():
    w = execute(["ds_write_b32 v0, v1 offset:16", "ds_write_b16_d16_hi v0, v2 offset:1024",
                 "ds_write_b128 v3, v[4:7]", "s_waitcnt lgkmcnt(0)",
                 "ds_read_b32 v8, v0 offset:16", "ds_read2st64_b32 v[9:10], v0 offset0:1 offset1:2",
                 "ds_read_u16 v11, v0 offset:1024", "ds_read_b128 v[12:15], v3",
                 "s_waitcnt lgkmcnt(0)"],
                v={0: LANE * 4, 1: LANE + 5, 2: (LANE + 7) << 16, 3: 2048 + LANE * 16,
                   4: 1, 5: 2, 6: 3, 7: LANE},
                lds=np.zeros(4096, np.uint8))
    assert np.array_equal(u32(w, 8), LANE + 5)
    # dwords 4..67 hold 5..68; read2st64 reads dwords lane + 64 and lane + 128
    assert np.array_equal(u32(w, 9), np.where(LANE < 4, LANE + 65, 0))
    assert np.all(u32(w, 10) == 0)
    assert np.all(u32(w, 11)[LANE % 2 == 0] == (LANE[LANE % 2 == 0] + 7))
    assert np.array_equal(np.stack([u32(w, 12 + k) for k in range(4)], 1),
                          np.stack([np.ones(64), 2 * np.ones(64), 3 * np.ones(64), LANE], 1))


def test_lds_read2_into_its_own_address_register():
    """The address is read once, when the instruction issues: a destination that
    overlaps it (as LLVM allocates `ds_read2st64_b32 v[6:7], v6 ...`) does not move the
    second read."""
    lds = np.arange(1024, dtype=np.uint32).view(np.uint8)
    w = execute(["ds_read2st64_b32 v[6:7], v6 offset0:1 offset1:2", "s_waitcnt lgkmcnt(0)"],
                v={6: LANE * 4}, lds=lds)
    assert np.array_equal(u32(w, 6), LANE + 64) and np.array_equal(u32(w, 7), LANE + 128)


def test_lds_out_of_range_is_an_error():
    with pytest.raises(ISAError, match=r"wave 0: ds_read_b32 at 0x0 accesses LDS bytes "
                                       r"128..131; the workgroup has 128"):
        execute(["ds_read_b32 v1, v0", "s_waitcnt lgkmcnt(0)"], v={0: LANE * 4},
                lds=np.zeros(128, np.uint8))


@pytest.mark.parametrize("pattern,src", [
    ("swizzle(SWAP,16)", lambda i: i ^ 16),
    ("swizzle(SWAP,1)", lambda i: i ^ 1),
    ("swizzle(REVERSE,8)", lambda i: i ^ 7),
    ("swizzle(QUAD_PERM,3,3,0,1)", lambda i: (i & ~3) + [3, 3, 0, 1][i & 3]),
    ("swizzle(BROADCAST,8,5)", lambda i: (i & ~7) + 5),
    ('swizzle(BITMASK_PERM,"00p11")', lambda i: (i & 0x20) | (i & 4) | 3),
])
def test_ds_swizzle(pattern, src):
    w = execute([f"ds_swizzle_b32 v1, v0 offset:{pattern}", "s_waitcnt lgkmcnt(0)"],
                v={0: LANE + 1000})
    assert list(u32(w, 1)) == [src(i) + 1000 for i in range(64)]


def test_ds_swizzle_inactive_source_reads_zero():
    w = execute(["ds_swizzle_b32 v1, v0 offset:swizzle(SWAP,1)", "s_waitcnt lgkmcnt(0)"],
                v={0: LANE + 1, 1: 99}, exec_mask=((1 << 64) - 1) & ~(1 << 5))
    assert (u32(w, 1)[4], u32(w, 1)[5], u32(w, 1)[6]) == (0, 99, 8)


def test_ds_permutes():
    """12.13: bpermute: lane i reads lane (addr_i / 4) % 64; permute: lane i's value goes
    to lane (addr_i / 4) % 64."""
    w = execute(["ds_bpermute_b32 v2, v0, v1", "ds_permute_b32 v3, v0, v1",
                 "s_waitcnt lgkmcnt(0)"], v={0: ((LANE * 5) % 64) * 4 + 256, 1: LANE * 10})
    assert np.array_equal(u32(w, 2), (LANE * 5) % 64 * 10)
    inv = np.zeros(64, int)
    inv[(LANE * 5) % 64] = LANE
    assert np.array_equal(u32(w, 3), inv * 10)


def test_ds_read_b64_tr_b16():
    """CDNA4 11.4: in each group of 16 lanes, the 64 halves read (lane-major) form a 4 x 16
    matrix and lane i gets its column i: element j = half number 16 j + i of the group."""
    lds = np.arange(1024, dtype=np.uint16).view(np.uint8)
    w = execute(["ds_read_b64_tr_b16 v[2:3], v0", "s_waitcnt lgkmcnt(0)"], "gfx950",
                v={0: LANE * 8}, lds=lds)
    halves = np.stack([u32(w, 2) & 0xFFFF, u32(w, 2) >> 16, u32(w, 3) & 0xFFFF, u32(w, 3) >> 16], 1)
    g, i = LANE // 16, LANE % 16
    want = 64 * g[:, None] + 16 * np.arange(4)[None, :] + i[:, None]
    assert np.array_equal(halves, want)


# ---- wait counters -------------------------------------------------------------------------------

def test_reading_a_load_before_its_waitcnt_is_an_error():
    data = np.arange(64, dtype=np.float32)
    mem, s = buffer(data)
    prog = ["buffer_load_dword v1, v0, s[4:7], 0 offen",
            "buffer_load_dword v2, v0, s[4:7], 0 offen",
            "s_waitcnt vmcnt(1)", "v_add_f32_e32 v3, v1, v1", "v_add_f32_e32 v4, v2, v2"]
    with pytest.raises(ISAError, match=r"v_add_f32_e32 at 0x10 reads v2 before the "
                                       r"buffer_load_dword at 0x4 that loads it has been "
                                       r"waited for \(s_waitcnt vmcnt\)"):
        execute(prog, v={0: LANE * 4}, s=s, mem=mem)
    w = execute(prog[:4] + ["s_waitcnt vmcnt(0)", prog[4]], v={0: LANE * 4}, s=s, mem=mem)
    assert np.array_equal(f32(w, 4), 2 * data)


def test_scalar_loads_need_lgkmcnt_zero():
    mem, s = buffer(np.arange(8, dtype=np.uint32))
    with pytest.raises(ISAError, match="s_add_u32 at 0x10 reads s10 before the s_load_dword "
                                       "at 0x0"):
        execute(["s_load_dword s10, s[4:5], 0x0", "s_load_dword s11, s[4:5], 0x4",
                 "ds_read_b32 v1, v0", "s_waitcnt lgkmcnt(1)", "s_add_u32 s12, s10, s11"],
                v={0: 0}, s=s, mem=mem, lds=np.zeros(16, np.uint8))


def test_lds_dma_race_is_reported():
    mem, s = buffer(np.arange(64, dtype=np.uint32))
    prog = ["s_mov_b32 m0, 0", "s_nop 0", "buffer_load_dword v0, s[4:7], 0 offen lds",
            "ds_read_b32 v1, v2", "s_waitcnt vmcnt(0) lgkmcnt(0)"]
    with pytest.raises(ISAError, match="ds_read_b32 at 0xc reads LDS bytes 0..255 while "
                                       "wave 0's buffer_load_dword at 0x8 may still be writing"):
        execute(prog, v={0: LANE * 4, 2: LANE * 4}, s=s, mem=mem, lds=np.zeros(256, np.uint8))
    w = execute(prog[:3] + ["s_waitcnt vmcnt(0)"] + prog[3:], v={0: LANE * 4, 2: LANE * 4},
                s=s, mem=mem, lds=np.zeros(256, np.uint8))
    assert np.array_equal(u32(w, 1), LANE)

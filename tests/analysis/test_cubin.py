"""Cubin analysis: ptxas -v log parsing and the SASS loop finder on real cuobjdump/nvdisasm
text (captured from ptxas 13.0 / cuobjdump 13.5 for the kernels in tests/toolchain), plus the
report end to end where the CUDA binaries are installed."""
import json

import pytest

from pykittens.analysis import cubin
from pykittens.toolchain import nvptx

# cuobjdump -sass of a wgmma loop that LLVM unrolled 8x (main loop 0x120-0x2c0) with a
# remainder loop (0x2f0-0x340); the `BRA 0x3f0` after EXIT is ptxas's end-of-code trap.
SASS_UNROLLED = r"""
	code for sm_90a
	.target	sm_90a

		Function : wgmma_loop
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                               /* 0x00000a00ff017b82 */
                                                                                        /* 0x000ff00000000800 */
        /*0010*/                   LDC R0, c[0x0][0x220] ;                              /* 0x00008800ff007b82 */
                                                                                        /* 0x000e220000000800 */
        /*0020*/                   UMOV UR4, 0x400 ;                                    /* 0x0000040000047882 */
        /*0030*/                   ULDC.64 UR8, c[0x0][0x208] ;
        /*0040*/                   CS2R R24, SRZ ;
        /*0050*/                   CS2R R26, SRZ ;
        /*0060*/                   S2UR UR5, SR_CgaCtaId ;
        /*0070*/                   ISETP.GE.AND P0, PT, R0.reuse, 0x8, PT ;
        /*0080*/                   VIMNMX R0, R0, 0x1, !PT ;
        /*0090*/                   LOP3.LUT R2, R0, 0x7, RZ, 0xc0, !PT ;
        /*00a0*/                   ULEA UR4, UR5, UR4, 0x18 ;
        /*00b0*/                   UMOV UR5, URZ ;
        /*00c0*/                   USHF.R.U32.HI UR4, URZ, 0x4, UR4 ;
        /*00d0*/                   UIADD3.64 UR6, UR4, 0x40, URZ ;
        /*00e0*/              @!P0 BRA 0x2f0 ;
        /*00f0*/                   LOP3.LUT R0, R0, 0x7ffffff8, RZ, 0xc0, !PT ;
        /*0100*/                   CS2R R24, SRZ ;
        /*0110*/                   CS2R R26, SRZ ;
        /*0120*/                   WARPGROUP.ARRIVE ;
        /*0130*/                   VIADD R0, R0, 0xfffffff8 ;
        /*0140*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0150*/                   ISETP.NE.U32.AND P0, PT, R0, RZ, PT ;
        /*0160*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0170*/                   WARPGROUP.ARRIVE ;
        /*0180*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0190*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*01a0*/                   WARPGROUP.ARRIVE ;
        /*01b0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*01c0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*01d0*/                   WARPGROUP.ARRIVE ;
        /*01e0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*01f0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0200*/                   WARPGROUP.ARRIVE ;
        /*0210*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0220*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0230*/                   WARPGROUP.ARRIVE ;
        /*0240*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0250*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0260*/                   WARPGROUP.ARRIVE ;
        /*0270*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0280*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0290*/                   WARPGROUP.ARRIVE ;
        /*02a0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*02b0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*02c0*/               @P0 BRA 0x120 ;
        /*02d0*/                   ISETP.NE.U32.AND P0, PT, R2, RZ, PT ;
        /*02e0*/              @!P0 BRA 0x350 ;
        /*02f0*/                   WARPGROUP.ARRIVE ;
        /*0300*/                   VIADD R2, R2, 0xffffffff ;
        /*0310*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0320*/                   ISETP.NE.U32.AND P0, PT, R2, RZ, PT ;
        /*0330*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0340*/               @P0 BRA 0x2f0 ;
        /*0350*/                   S2R R5, SR_TID.X ;
        /*0360*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0370*/                   ULDC UR4, c[0x0][0x21c] ;
        /*0380*/                   FADD R24, R24, R25 ;
        /*0390*/                   FADD R27, R26, R27 ;
        /*03a0*/                   FADD R27, R24, R27 ;
        /*03b0*/                   IMAD R5, R5, UR4, RZ ;
        /*03c0*/                   IMAD.WIDE R2, R5, 0x4, R2 ;
        /*03d0*/                   STG.E desc[UR8][R2.64], R27 ;
        /*03e0*/                   EXIT ;
        /*03f0*/                   BRA 0x3f0;
        /*0400*/                   NOP;
        /*0410*/                   NOP;
        /*0420*/                   NOP;
		..........
"""

# cuobjdump -sass of a loop that waits on an mbarrier (SYNCS.PHASECHK retry loops) before
# each wgmma: the innermost backward branches are the spin-waits, which hold no HGMMA.
SASS_WAIT = r"""
	code for sm_90a
	.target	sm_90a
		Function : wgmma_wait_loop
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDC R2, c[0x0][0x220] ;
        /*0020*/                   UMOV UR4, 0x400 ;
        /*0030*/                   UMOV UR5, URZ ;
        /*0040*/                   ULDC.64 UR10, c[0x0][0x208] ;
        /*0050*/                   IMAD.MOV.U32 R0, RZ, RZ, RZ ;
        /*0060*/                   CS2R R24, SRZ ;
        /*0070*/                   CS2R R26, SRZ ;
        /*0080*/                   S2UR UR8, SR_CgaCtaId ;
        /*0090*/                   ISETP.GE.AND P0, PT, R2, 0x2, PT ;
        /*00a0*/                   ULEA UR8, UR8, UR4, 0x18 ;
        /*00b0*/                   USHF.R.U32.HI UR4, URZ, 0x4, UR8 ;
        /*00c0*/                   UIADD3.64 UR6, UR4, 0x40, URZ ;
        /*00d0*/              @!P0 BRA 0x250 ;
        /*00e0*/                   VIMNMX R2, R2, 0x1, !PT ;
        /*00f0*/                   IMAD.MOV.U32 R0, RZ, RZ, RZ ;
        /*0100*/                   CS2R R24, SRZ ;
        /*0110*/                   CS2R R26, SRZ ;
        /*0120*/                   LOP3.LUT R3, R2, 0x7ffffffe, RZ, 0xc0, !PT ;
        /*0130*/                   SHF.L.U32 R4, RZ, 0x1f, RZ ;
        /*0140*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R4 ;
        /*0150*/              @!P0 BRA 0x130 ;
        /*0160*/                   WARPGROUP.ARRIVE ;
        /*0170*/                   IMAD.MOV.U32 R4, RZ, RZ, 0x1 ;
        /*0180*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0190*/                   SHF.L.U32 R4, R4, 0x1f, RZ ;
        /*01a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*01b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R4 ;
        /*01c0*/              @!P0 BRA 0x1b0 ;
        /*01d0*/                   WARPGROUP.ARRIVE ;
        /*01e0*/                   VIADD R0, R0, 0x2 ;
        /*01f0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0200*/                   ISETP.NE.U32.AND P0, PT, R3, R0, PT ;
        /*0210*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0220*/               @P0 BRA 0x130 ;
        /*0230*/                   LOP3.LUT P0, RZ, R2, 0x1, RZ, 0xc0, !PT ;
        /*0240*/              @!P0 BRA 0x2c0 ;
        /*0250*/                   LOP3.LUT R0, R0, 0x1, RZ, 0xc0, !PT ;
        /*0260*/                   SHF.L.U32 R0, R0, 0x1f, RZ ;
        /*0270*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R0 ;
        /*0280*/              @!P0 BRA 0x270 ;
        /*0290*/                   WARPGROUP.ARRIVE ;
        /*02a0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*02b0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*02c0*/                   S2R R5, SR_TID.X ;
        /*02d0*/                   LDC.64 R2, c[0x0][0x210] ;
        /*02e0*/                   ULDC UR4, c[0x0][0x21c] ;
        /*02f0*/                   FADD R24, R24, R25 ;
        /*0300*/                   FADD R27, R26, R27 ;
        /*0310*/                   FADD R27, R24, R27 ;
        /*0320*/                   IMAD R5, R5, UR4, RZ ;
        /*0330*/                   IMAD.WIDE R2, R5, 0x4, R2 ;
        /*0340*/                   STG.E desc[UR10][R2.64], R27 ;
        /*0350*/                   EXIT ;
        /*0360*/                   BRA 0x360;
        /*0370*/                   NOP;
        /*0380*/                   NOP;
"""

# nvdisasm -c of the same kernel: labels instead of addresses in branch targets.
SASS_NVDISASM = r"""
	.section	.text.wgmma_wait_loop,"ax",@progbits
	.align	128
        .global         wgmma_wait_loop
wgmma_wait_loop:
.text.wgmma_wait_loop:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDC R2, c[0x0][0x220] ;
        /*0020*/                   UMOV UR4, 0x400 ;
        /*0030*/                   UMOV UR5, URZ ;
        /*0040*/                   ULDC.64 UR10, c[0x0][0x208] ;
        /*0050*/                   IMAD.MOV.U32 R0, RZ, RZ, RZ ;
        /*0060*/                   CS2R R24, SRZ ;
        /*0070*/                   CS2R R26, SRZ ;
        /*0080*/                   S2UR UR8, SR_CgaCtaId ;
        /*0090*/                   ISETP.GE.AND P0, PT, R2, 0x2, PT ;
        /*00a0*/                   ULEA UR8, UR8, UR4, 0x18 ;
        /*00b0*/                   USHF.R.U32.HI UR4, URZ, 0x4, UR8 ;
        /*00c0*/                   UIADD3.64 UR6, UR4, 0x40, URZ ;
        /*00d0*/              @!P0 BRA `(.L_x_0) ;
        /*00e0*/                   VIMNMX R2, R2, 0x1, !PT ;
        /*00f0*/                   IMAD.MOV.U32 R0, RZ, RZ, RZ ;
        /*0100*/                   CS2R R24, SRZ ;
        /*0110*/                   CS2R R26, SRZ ;
        /*0120*/                   LOP3.LUT R3, R2, 0x7ffffffe, RZ, 0xc0, !PT ;
.L_x_1:
        /*0130*/                   SHF.L.U32 R4, RZ, 0x1f, RZ ;
.L_x_6:
        /*0140*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R4 ;
        /*0150*/              @!P0 BRA `(.L_x_1) ;
        /*0160*/                   WARPGROUP.ARRIVE ;
        /*0170*/                   IMAD.MOV.U32 R4, RZ, RZ, 0x1 ;
        /*0180*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0190*/                   SHF.L.U32 R4, R4, 0x1f, RZ ;
        /*01a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
.L_x_2:
        /*01b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R4 ;
        /*01c0*/              @!P0 BRA `(.L_x_2) ;
        /*01d0*/                   WARPGROUP.ARRIVE ;
        /*01e0*/                   VIADD R0, R0, 0x2 ;
        /*01f0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0200*/                   ISETP.NE.U32.AND P0, PT, R3, R0, PT ;
        /*0210*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0220*/               @P0 BRA `(.L_x_1) ;
        /*0230*/                   LOP3.LUT P0, RZ, R2, 0x1, RZ, 0xc0, !PT ;
        /*0240*/              @!P0 BRA `(.L_x_3) ;
.L_x_0:
        /*0250*/                   LOP3.LUT R0, R0, 0x1, RZ, 0xc0, !PT ;
        /*0260*/                   SHF.L.U32 R0, R0, 0x1f, RZ ;
.L_x_4:
        /*0270*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R0 ;
        /*0280*/              @!P0 BRA `(.L_x_4) ;
        /*0290*/                   WARPGROUP.ARRIVE ;
        /*02a0*/                   HGMMA.64x8x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*02b0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
.L_x_3:
        /*02c0*/                   S2R R5, SR_TID.X ;
        /*02d0*/                   LDC.64 R2, c[0x0][0x210] ;
        /*02e0*/                   ULDC UR4, c[0x0][0x21c] ;
        /*02f0*/                   FADD R24, R24, R25 ;
        /*0300*/                   FADD R27, R26, R27 ;
        /*0310*/                   FADD R27, R24, R27 ;
        /*0320*/                   IMAD R5, R5, UR4, RZ ;
        /*0330*/                   IMAD.WIDE R2, R5, 0x4, R2 ;
        /*0340*/                   STG.E desc[UR10][R2.64], R27 ;
.L_x_9:
        /*0350*/                   EXIT ;
.L_x_5:
        /*0360*/                   BRA `(.L_x_5);
"""

# Hand-made from SASS_WAIT's shape, the way ptxas lays out CUTLASS-style pipelines: the failed
# try-wait jumps forward to a retry block placed after EXIT, which jumps back into the loop.
# A backward-branch scan sees [0x70, 0x140] and [0x120, 0x130] as loops; the CFG does not.
SASS_OUT_OF_LINE = r"""
	.section	.text.pipelined,"ax",@progbits
pipelined:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2UR UR8, SR_CgaCtaId ;
        /*0020*/                   IMAD.MOV.U32 R0, RZ, RZ, RZ ;
        /*0030*/                   CS2R R24, SRZ ;
.L_x_2:
        /*0040*/                   SHF.L.U32 R4, R0, 0x1f, RZ ;
        /*0050*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R4 ;
        /*0060*/              @!P0 BRA `(.L_x_5) ;
.L_x_6:
        /*0070*/                   WARPGROUP.ARRIVE ;
        /*0080*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0090*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4+0x2], R24 ;
        /*00a0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4+0x4], R24 ;
        /*00b0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4+0x6], R24, gsb0 ;
        /*00c0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00d0*/                   VIADD R0, R0, 0x1 ;
        /*00e0*/                   ISETP.NE.AND P0, PT, R0, R2, PT ;
        /*00f0*/               @P0 BRA `(.L_x_2) ;
        /*0100*/                   STG.E desc[UR10][R2.64], R24 ;
        /*0110*/                   EXIT ;
.L_x_5:
        /*0120*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R4 ;
        /*0130*/              @!P0 BRA `(.L_x_5) ;
        /*0140*/                   BRA `(.L_x_6) ;
.L_x_7:
        /*0150*/                   BRA `(.L_x_7);
        /*0160*/                   NOP;
"""

LOG_13 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'wgmma_loop' for 'sm_90a'
ptxas info    : Function properties for wgmma_loop
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers
ptxas info    : Compile time = 35.934 ms
"""

LOG_SPILL = """\
ptxas info    : Overriding maximum register limit 256 for 'spill' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_90a'
ptxas info    : Function properties for spill
    232 bytes stack frame, 228 bytes spill stores, 228 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 232 bytes cumulative stack size
ptxas info    : Compile time = 8.277 ms
"""

# CUDA 12.x style: no 'used N barriers' unless nonzero, smem and cmem on the 'Used' line, and
# a device function's properties interleaved with an entry's.
LOG_12 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4gemmPKfS0_Pf' for 'sm_90a'
ptxas info    : Function properties for _Z4gemmPKfS0_Pf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'attn' for 'sm_90a'
ptxas info    : Function properties for helper
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for attn
    8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8 bytes cumulative stack size, 49152 bytes smem, 380 bytes cmem[0]
"""


def test_ptxas_log_current_format():
    assert cubin.parse_ptxas_log(LOG_13) == {"wgmma_loop": {
        "registers": 30, "smem_bytes": 0, "stack_bytes": 0, "spill_stores": 0,
        "spill_loads": 0, "barriers": 0}}


def test_ptxas_log_spills():
    s = cubin.parse_ptxas_log(LOG_SPILL)["spill"]
    assert (s["registers"], s["stack_bytes"], s["spill_stores"], s["spill_loads"]) == \
        (24, 232, 228, 228)


def test_ptxas_log_two_entries_and_a_device_function():
    s = cubin.parse_ptxas_log(LOG_12)
    assert set(s) == {"_Z4gemmPKfS0_Pf", "attn"}                 # 'helper' is not an entry
    assert (s["_Z4gemmPKfS0_Pf"]["registers"], s["_Z4gemmPKfS0_Pf"]["smem_bytes"]) == (168, 1024)
    a = s["attn"]
    assert (a["registers"], a["smem_bytes"], a["stack_bytes"], a["barriers"]) == (40, 49152, 8, 1)
    assert (a["spill_stores"], a["spill_loads"]) == (4, 8)


def test_sass_unrolled_loop():
    funcs = cubin.parse_sass(SASS_UNROLLED)
    instrs, labels = funcs["wgmma_loop"]
    assert instrs[0].addr == 0 and instrs[0].opcode == "LDC"
    bra = [i for i in instrs if i.op == "BRA"]
    assert [(i.pred, i.addr) for i in bra[:2]] == [("@!P0", 0xE0), ("@P0", 0x2C0)]
    a = cubin.analyze_sass(instrs, labels)
    assert a["loop_wgmma"] == 8
    assert [(lp["start"], lp["end"], lp["wgmma"]) for lp in a["loops"]] == \
        [(0x120, 0x2C0, 8), (0x2F0, 0x340, 1)]
    assert a["sass_mix"]["HGMMA"] == 9 and a["sass_mix"]["EXIT"] == 1
    assert "NOP" not in a["sass_mix"]             # the padding after the trap is unreachable


def test_sass_spin_waits_do_not_hide_the_main_loop():
    instrs, labels = cubin.parse_sass(SASS_WAIT)["wgmma_wait_loop"]
    a = cubin.analyze_sass(instrs, labels)
    assert a["loop_wgmma"] == 2
    inner = [lp for lp in a["loops"] if lp["innermost_wgmma"]]
    assert [(lp["start"], lp["end"]) for lp in inner] == [(0x130, 0x220)]
    assert sum(lp["wgmma"] == 0 for lp in a["loops"]) == 2        # the other two spin-waits


def test_sass_spills_in_the_main_loop_are_counted():
    """loop_spills: local-memory loads and stores inside the innermost wgmma loop, not
    those before it; the clean listing has none."""
    clean = cubin.analyze_sass(*cubin.parse_sass(SASS_WAIT)["wgmma_wait_loop"])
    assert clean["loop_spills"] == 0
    spilled = SASS_WAIT.replace(
        "IMAD.MOV.U32 R4, RZ, RZ, 0x1 ;", "LDL R4, [R1+0x4] ;").replace(
        "CS2R R24, SRZ ;\n        /*0070*/", "STL [R1], R2 ;\n        /*0070*/", 1)
    assert spilled.count("LDL") == 1 and spilled.count("STL") == 1
    a = cubin.analyze_sass(*cubin.parse_sass(spilled)["wgmma_wait_loop"])
    assert a["loop_spills"] == 1 and a["sass_mix"]["STL"] == 1


def test_sass_nvdisasm_labels():
    funcs = cubin.parse_sass(SASS_NVDISASM)
    instrs, labels = funcs["wgmma_wait_loop"]
    assert labels[".L_x_1"] == 0x130 and labels[".L_x_3"] == 0x2C0
    a = cubin.analyze_sass(instrs, labels)
    assert a["loop_wgmma"] == 2 and a["sass_mix"]["HGMMA"] == 3


def test_sass_out_of_line_retry_block():
    instrs, labels = cubin.parse_sass(SASS_OUT_OF_LINE)["pipelined"]
    a = cubin.analyze_sass(instrs, labels)
    assert a["loop_wgmma"] == 4
    main = [lp for lp in a["loops"] if lp["innermost_wgmma"]]
    assert len(main) == 1 and main[0]["start"] == 0x40
    assert main[0]["end"] == 0x140              # the retry blocks belong to the main loop
    assert [lp["start"] for lp in a["loops"]] == [0x40, 0x120]


def test_report_without_cubin_says_what_to_install():
    res = {"ptx": "", "cubin": None, "ptxas_log": nvptx.install_hint("ptxas"),
           "kernels": ["k"]}
    rep = cubin.report(res)
    assert rep["kernel"] == "k" and rep["registers"] is None and rep["loop_wgmma"] is None
    assert "nvidia-cuda-nvcc" in rep["notes"][0]
    json.dumps(rep)


def test_report_kernel_choice():
    res = {"cubin": b"\x7fELF", "ptxas_log": LOG_12, "kernels": []}
    with pytest.raises(ValueError, match="2 kernels.*kernel=NAME"):
        cubin.report(res)
    with pytest.raises(KeyError, match="'gemm' is not in the ptxas log"):
        cubin.report(res, kernel="gemm")


WGMMA_IR = r"""
target triple = "nvptx64-nvidia-cuda"
@smem = external addrspace(3) global [0 x i8], align 16
define ptx_kernel void @mma(ptr addrspace(1) %out, i32 %out.size0, i32 %out.stride0, i32 %n) {
entry:
  %sa = ptrtoint ptr addrspace(3) @smem to i32
  %d = zext i32 %sa to i64
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%inext, %loop]
  %a = phi float [0.0, %entry], [%r0, %loop]
  call void asm sideeffect "wgmma.fence.sync.aligned;", "~{memory}"()
  %r = call {float, float, float, float} asm sideeffect "{\0A.reg .pred p;\0Asetp.ne.b32 p, $6, 0;\0Awgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {$0, $1, $2, $3}, $4, $5, p, 1, 1, 0, 0;\0A}", "=f,=f,=f,=f,l,l,r,0,1,2,3,~{memory}"(i64 %d, i64 %d, i32 1, float %a, float %a, float %a, float %a)
  call void asm sideeffect "wgmma.commit_group.sync.aligned;\0Awgmma.wait_group.sync.aligned 0;", "~{memory}"()
  %r0 = extractvalue {float, float, float, float} %r, 0
  %inext = add i32 %i, 1
  %c = icmp slt i32 %inext, %n
  br i1 %c, label %loop, label %exit
exit:
  store float %r0, ptr addrspace(1) %out
  ret void
}
"""

needs_ptxas = pytest.mark.skipif(
    nvptx.find_ptxas() is None,
    reason="ptxas not found: pip install nvidia-cuda-nvcc-cu12 (or the CUDA toolkit)")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path / "cache"))


@needs_ptxas
def test_report_without_cuobjdump(monkeypatch):
    monkeypatch.setattr(cubin, "find_cuda_tool", lambda name: None)
    rep = cubin.report(nvptx.compile_ir(WGMMA_IR))
    assert rep["kernel"] == "mma" and rep["registers"] > 0 and rep["spill_bytes"] == 0
    assert rep["sass_mix"] is None and rep["loop_wgmma"] is None
    assert "nvidia-cuda-cuobjdump" in " ".join(rep["notes"])


@needs_ptxas
@pytest.mark.skipif(nvptx.find_cuda_tool("cuobjdump") is None
                    or nvptx.find_cuda_tool("nvdisasm") is None,
                    reason="cuobjdump/nvdisasm not found: pip install nvidia-cuda-cuobjdump "
                           "nvidia-cuda-nvdisasm (or the CUDA toolkit)")
def test_report_with_sass():
    rep = cubin.report(nvptx.compile_ir(WGMMA_IR), kernel="mma")
    # every tool ran; the notes are ptxas's advisories about this hand-written wgmma (C7519:
    # warpgroup.arrive injected where the IR has no wgmma.fence; C7511: serialised)
    assert rep["notes"] and all(n.startswith(("ptxas C7519", "ptxas C7511"))
                                for n in rep["notes"])
    assert rep["sass_mix"]["HGMMA"] >= 1 and rep["loop_wgmma"] >= 1
    json.dumps(rep)


def test_ptxas_advisories_become_notes():
    log = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions "
           "are serialized due to non wgmma instructions reading accumulator registers of  a "
           "wgmma between start and end of the pipeline stage in the function 'k'\n"
           "ptxas info    : Used 168 registers, used 1 barriers\n"
           "ptxas warning : (C7508) Potential Performance Loss: setmaxnreg ignored\n")
    notes = cubin.ptxas_advisories(log)
    assert notes == ["ptxas C7514: Potential Performance Loss: wgmma.mma_async instructions "
                     "are serialized due to non wgmma instructions reading accumulator "
                     "registers of a wgmma between start and end of the pipeline stage in "
                     "the function 'k'",
                     "ptxas C7508: Potential Performance Loss: setmaxnreg ignored"]
    assert cubin.ptxas_advisories("ptxas info    : Used 8 registers") == []

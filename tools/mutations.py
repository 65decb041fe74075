#!/usr/bin/env python3
"""Mutation check of the CDNA lowering and code generation: plant one realistic bug at a
time in a private copy of the repository and run the part of the project's own test suite
that should notice it. Every mutation must be caught (its tests fail); one that is not is a
gap in the oracles.

    python3 tools/mutations.py                 # all mutations, a table, exit 1 if any missed
    python3 tools/mutations.py --list          # what each mutation plants, and where
    python3 tools/mutations.py NAME ...        # some of them
    python3 tools/mutations.py NAME --full     # run the whole subset: every test that fails
    python3 tools/mutations.py NAME --tests tests/isa   # another subset (exploring)
    python3 tools/mutations.py --baseline      # the subsets pass on the unmutated code

Each mutation is a list of exact text edits (each must match once). The tree is copied to a
temporary directory (the working tree is never touched), the edits applied there, and pytest
runs in a subprocess with PYTHONPATH at the copy and a private, empty PYKITTENS_CACHE, so no
code object built by the unmutated compiler is reused. Outcomes: `caught` (a test failed),
`MISSED` (the subset passed), `broken` (the mutated package does not import: not a valid
mutation), `error` (pytest could not run the subset) and `timeout`.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", "build", "dist", ".venv", ".whl",
             ".mypy_cache", ".ruff_cache", ".hypothesis"}


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple            # (path relative to the repository root, old text, new text)
    bug: str                # the bug, as a developer could have written it
    tests: tuple            # pytest arguments: the subset that must fail
    catches: str = ""       # which oracle fails, for the table in docs/targets/cdna.md

    @property
    def where(self) -> str:
        """file: function (of the first edit)."""
        path, old, _ = self.edits[0]
        return f"{path}: {_enclosing(path, old)}"


def _enclosing(path: str, old: str) -> str:
    """The def/class (or top-level name) the text `old` sits in."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    at = text.find(old)
    if at < 0:
        return "?"
    head = text[:at]
    # the assignment or def on the line `old` starts on
    line = text[head.rfind("\n") + 1:text.find("\n", at)]
    m = re.match(r"([A-Z_][A-Z0-9_]*) =", line)
    if m:
        return m.group(1)
    defs = re.findall(r"^( {0,4})(?:def|class) (\w+)", head, re.M)     # not nested ones
    if not defs:
        return "module"
    indent, name = defs[-1]
    if indent:
        cls = [n for i, n in re.findall(r"^( *)class (\w+)", head, re.M) if not i]
        return f"{cls[-1]}.{name}" if cls else name
    return name


def _m(name, path, old, new, bug, tests, catches="", more=()):
    return Mutation(name, ((path, old, new), *more), bug, tuple(tests), catches)


CDNA_PY = "pykittens/targets/cdna.py"
GFX942_PY = "pykittens/targets/gfx942.py"
GFX950_PY = "pykittens/targets/gfx950.py"
AMDGPU_PY = "pykittens/codegen/amdgpu.py"
LLVM_PY = "pykittens/codegen/llvm.py"
LANE_PY = "pykittens/lower/lane.py"
LOWER_PY = "pykittens/lower/lower.py"
ISA_KERNELS = "tests/isa/test_isa_kernels.py"

MUTATIONS: list[Mutation] = []
MUTATIONS += [
    _m("dpp-quad-perm", CDNA_PY,
       "DPP_QUAD_PERM_XOR = {1: 0b10_11_00_01, 2: 0b01_00_11_10}",
       "DPP_QUAD_PERM_XOR = {1: 0b01_00_11_10, 2: 0b10_11_00_01}",
       "quad_perm selectors packed first-lane-highest: lane ^ 1 becomes [2,3,0,1] and "
       "lane ^ 2 [1,0,3,2]",
       ["tests/isa"]),
    _m("ds-swizzle-xor", CDNA_PY,
       "return 0x1F | (mask << 10)",
       "return 0x1F | (mask << 5)",
       "ds_swizzle offset: the mask in the or_mask field (bits 9:5) instead of xor_mask "
       "(14:10)",
       ["tests/isa"]),
    _m("mfma-acc-rows", CDNA_PY,
       "    bits += [(0, 4 << b) for b in range(groups.bit_length() - 1)]\n"
       "    slots = [(4 * groups * (s // 4) + s % 4, 0) for s in range(m * n // WAVE)]",
       "    bits += [(0, (m * n // WAVE) << b) for b in range(groups.bit_length() - 1)]\n"
       "    slots = [(s, 0) for s in range(m * n // WAVE)]",
       "32x32 accumulator rows as contiguous halves (lanes 32-63 rows 16-31) instead of "
       "runs of 4 rows interleaved between the lane groups",
       ["tests/isa"]),
    _m("waitcnt-vmcnt-high", CDNA_PY,
       "((vm >> 4) << 14)",
       "((vm >> 4) << 12)",
       "s_waitcnt: vmcnt bits 5:4 placed at 13:12 instead of 15:14",
       ["tests/test_schedule.py", "tests/isa"]),
    _m("f8f6f4-operand-runs", CDNA_PY,
       "    bits += [(other, 16 << b) for b in range(groups.bit_length() - 1)]\n"
       "    runs = [r * (k // 2) + s for r in range(2) for s in range(16)]",
       "    bits += [(other, 32 << b) for b in range(groups.bit_length() - 1)]\n"
       "    runs = [16 * r + s for r in range(2) for s in range(16)]",
       "fp8 operands of the f8f6f4 MFMAs as 32 consecutive K per lane (the FP4 packing) "
       "instead of two runs of 16, K/2 apart",
       ["tests/isa", "tests/test_mx_layout.py", "tests/test_cdna_hazards.py"]),
    _m("f8f6f4-format-codes", CDNA_PY,
       'F8F6F4_FORMAT = {"e4m3": 0, "e5m2": 1}',
       'F8F6F4_FORMAT = {"e4m3": 1, "e5m2": 0}',
       "cbsz/blgp format codes swapped: E4M3 operands decoded as E5M2 and back",
       ["tests/isa", "tests/test_mx_layout.py", "tests/test_cdna_hazards.py", "tests/test_mma.py"]),
    _m("tr16-source", CDNA_PY,
       "return 4 * element + lane // 4, lane % 4",
       "return 4 * element + lane % 4, lane // 4",
       "ds_read_b64_tr_b16's exchange: the source lane and element of a 16-lane group "
       "swapped",
       ["tests/isa", "tests/test_kernels.py"]),
    _m("cdna4-wait-states", CDNA_PY,
       "WAIT_STATES_CDNA4 = _xdl_wait_states(1)",
       "WAIT_STATES_CDNA4 = _xdl_wait_states(0)",
       "gfx950 given gfx942's MFMA wait states (one short after 4/8/16-pass results)",
       ["tests/isa", "tests/test_cdna_hazards.py"]),
    _m("krun-group-stride", CDNA_PY,
       "    bits += [(other, run << b) for b in range(groups.bit_length() - 1)]",
       "    bits += [(other, per_lane << b) for b in range(groups.bit_length() - 1)]",
       "krun operand layouts keep the plain lane-group stride along K (the per-lane count) "
       "instead of the run length",
       ["tests/isa", "tests/test_layout_convert.py"]),
    _m("gfx942-mfma-passes", GFX942_PY,
       "intrinsic, passes=8 if m == 32 else 4)",
       "intrinsic, passes=4)",
       "gfx942: every MFMA taken as 4 passes (the 32x32 ones take 8): too few wait states "
       "after a pinned 32x32 result",
       ["tests/isa", "tests/test_cdna_hazards.py"]),
    _m("f8f6f4-passes", GFX950_PY,
       "passes = (16 if m == 32 else 8) if f8f6f4 else (8 if m == 32 else 4)",
       "passes = 8 if m == 32 else 4",
       "gfx950: the f8f6f4 MFMAs given the 16-bit MFMAs' pass counts (8/4 instead of 16/8)",
       ["tests/isa", "tests/test_cdna_hazards.py"]),
    _m("mfma-operand-order", AMDGPU_PY,
       '            args = [str(av), str(bv), str(cv), "i32 0", "i32 0", "i32 0"]',
       '            args = [str(bv), str(av), str(cv), "i32 0", "i32 0", "i32 0"]',
       "the MFMA intrinsic called with B as src0 and A as src1",
       ["tests/isa"]),
    _m("buffer-num-records", AMDGPU_PY,
       '            s0 = self.op(f"zext i32 %{gl.name}.stride0 to i64", "i64", 0)',
       '            s0 = self.op(f"zext i32 %{gl.name}.size{gl.type.rank - 1} to i64", "i64", 0)',
       "a buffer's num_records from the last dim's size instead of the row stride: the "
       "tail of a tensor with padded rows reads 0",
       ["tests/isa"]),
    _m("pinned-wait-gap", AMDGPU_PY,
       "            return self.hz_pos - pos - 1",
       "            return self.hz_pos - pos",
       "the pinned-register hazard tracker counts the producer itself as a wait state",
       ["tests/isa", "tests/test_cdna_hazards.py"]),
    _m("lds-dma-wave-base", AMDGPU_PY,
       '        wave_first = self.op(f"and i32 {self.tid.text}, {-self.p.wave_size}", "i32", 0)',
       '        wave_first = self.op(f"and i32 {self.tid.text}, {self.p.wave_size - 1}", "i32", 0)',
       "the LDS DMA's base from tid & 63 (the lane) instead of tid & -64 (the wave's first "
       "lane): every wave writes where wave 0's chunks go",
       ["tests/isa", "tests/test_codegen.py"]),
    _m("wave-id-shift", AMDGPU_PY,
       '            w = self.op(f"lshr i32 {self.tid.text}, {self.p.wave_size.bit_length() - 1}", "i32", 0)',
       '            w = self.op(f"lshr i32 {self.tid.text}, {self.p.wave_size.bit_length()}", "i32", 0)',
       "the uniform wave id (readfirstlane of tid >> 6) shifted by 7: waves 2k and 2k+1 "
       "both see k",
       ["tests/isa"]),
    _m("bpermute-lane-address", AMDGPU_PY,
       '            addr = self.op(f"shl i32 {addr.text}, 2", "i32", 0)\n',
       "",
       "ds_bpermute given the source lane's index instead of its byte address (lane * 4)",
       ["tests/isa"]),
    _m("float-to-int-truncates", LLVM_PY,
       "                                   [str(r)]), e, n)",
       "                                   [str(v)]), e, n)",
       "f32 -> int casts convert the value before llvm.rint: they round toward zero",
       ["tests/isa", "tests/test_emulator.py"]),
    _m("lds-swizzle-mask-codegen", LLVM_PY,
       '        rs = self.op(f"and i32 {row.text}, {t.swizzle - 1}", "i32", 0)',
       '        rs = self.op(f"and i32 {row.text}, {t.swizzle}", "i32", 0)',
       "the LDS swizzle XORs the chunk index with row & swizzle instead of row & (swizzle - 1)",
       ["tests/isa", "tests/test_codegen.py"]),
    _m("lds-swizzle-mask-lane", LANE_PY,
       "            b = (((b >> 4) ^ (row & (t.swizzle - 1))) << 4) | (b & 15)",
       "            b = (((b >> 4) ^ (row & t.swizzle)) << 4) | (b & 15)",
       "LDSRegion.byte_offset (the lane emulator's LDS) XORs with row & swizzle",
       ["tests/test_emulator.py", "tests/test_codegen.py", "tests/test_kernels.py"]),
    _m("lds-region-base", LLVM_PY,
       '        return self.op(f"add i32 {a.text}, {self.region_base(region).text}", "i32", 0)',
       "        return a",
       "shared-tile addresses without the region's base: every tile starts at LDS byte 0",
       ["tests/isa"]),
    _m("edge-mask-off-by-one", LLVM_PY,
       '        hi = self.op(f"icmp slt i32 {v.text}, {size.text}", "i1", 0)',
       '        hi = self.op(f"icmp sle i32 {v.text}, {size.text}", "i1", 0)',
       "per-lane bounds on the edge path test index <= size: one element past the end is "
       "read and written",
       ["tests/isa"]),
    _m("edge-store-run-vector", LLVM_PY,
       '                v_l, e_l, j_l = self.branch(run_full, "run_vec", "run_elem", "run_join")\n'
       "                self.start_block(v_l)\n"
       "                self.align = align\n"
       "                self.store_run(",
       '                v_l, e_l, j_l = self.branch(ok, "run_vec", "run_elem", "run_join")\n'
       "                self.start_block(v_l)\n"
       "                self.align = align\n"
       "                self.store_run(",
       "on the edge path a run is stored as one vector when its row is inside, without "
       "checking that its columns are: the stores run past the row's end",
       ["tests/isa"]),
    _m("mx-scale-operands-swapped", AMDGPU_PY,
       '                    str(self._scale_operand(op.srcs[3], op.attrs["sa_slots"])), "i32 0",\n'
       '                    str(self._scale_operand(op.srcs[4], op.attrs["sb_slots"]))]',
       '                    str(self._scale_operand(op.srcs[4], op.attrs["sb_slots"])), "i32 0",\n'
       '                    str(self._scale_operand(op.srcs[3], op.attrs["sa_slots"]))]',
       "the block-scaled MFMA intrinsic given B's E8M0 scales for A and A's for B",
       ["tests/isa", "tests/test_mx_layout.py", "tests/test_mma.py"]),
    _m("mma-base-slots", LOWER_PY,
       "        index = i * (v.type.shape[1] // base.shape[1]) + j",
       "        index = i * (v.type.shape[0] // base.shape[0]) + j",
       "base tile (i, j) of a role tile numbered with the tile's row count instead of its "
       "column count",
       ["tests/isa", "tests/test_mma.py"]),
]


def _copy_tree(dst: str):
    """The repository's files (not .git, caches or build outputs) under dst."""
    def ignore(d, names):
        return [n for n in names if n in SKIP_DIRS or n.endswith((".pyc", ".egg-info"))]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def apply(m: Mutation, repo: str):
    """Apply the mutation's edits to the tree at `repo` (each old text exactly once)."""
    for path, old, new in m.edits:
        p = os.path.join(repo, path)
        with open(p) as f:
            text = f.read()
        n = text.count(old)
        if n != 1:
            raise ValueError(f"{m.name}: the text to replace occurs {n} times in {path}: {old!r}")
        with open(p, "w") as f:
            f.write(text.replace(old, new))


def check_applies(m: Mutation):
    """The mutation's edits match the working tree once each (read only)."""
    for path, old, _ in m.edits:
        with open(os.path.join(ROOT, path)) as f:
            n = f.read().count(old)
        if n != 1:
            raise ValueError(f"{m.name}: the text to replace occurs {n} times in {path}: {old!r}")


def _env(repo: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = repo
    env["PYKITTENS_CACHE"] = cache
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _module(path: str) -> str:
    return path[:-3].replace("/", ".") if path.endswith(".py") else "pykittens"


@dataclass
class Result:
    name: str
    outcome: str            # caught / MISSED / broken / error / timeout
    seconds: float
    failed: list            # failing test ids (the first only, unless --full)
    log: str


def run_one(m: Mutation | None, tests, timeout: float, full: bool, keep: bool = False,
            name: str | None = None) -> Result:
    """Copy the tree, apply `m` (None: unmutated), import the mutated modules, run pytest."""
    name = name or (m.name if m else "baseline")
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=f"pk-mut-{name}-")
    try:
        repo, cache = os.path.join(tmp, "repo"), os.path.join(tmp, "cache")
        _copy_tree(repo)
        os.mkdir(cache)
        env = _env(repo, cache)
        mods = sorted({_module(p) for p, _, _ in m.edits}) if m else ["pykittens"]
        if m:
            apply(m, repo)
        probe = ("import importlib, os, sys\n"
                 f"for name in {mods!r}:\n"
                 "    mod = importlib.import_module(name)\n"
                 f"    assert os.path.realpath(mod.__file__).startswith(os.path.realpath({repo!r})), mod.__file__\n"
                 "import pykittens.compiler, pykittens.codegen.amdgpu\n")
        r = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=120)
        if r.returncode:
            return Result(name, "broken", time.time() - t0, [], r.stdout + r.stderr)
        cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
               "--no-header", *([] if full else ["-x"]), *tests]
        try:
            r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or "")
            return Result(name, "timeout", time.time() - t0, [], out)
        log = r.stdout + r.stderr
        failed = re.findall(r"^FAILED (\S+)", log, re.M)
        outcome = {0: "MISSED" if m else "passed", 1: "caught" if m else "FAILED"}.get(
            r.returncode, "error")
        return Result(name, outcome, time.time() - t0, failed, log)
    finally:
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def table(results, by_name) -> str:
    rows = ["| mutation | where | outcome | s | first failing test |", "|---|---|---|---|---|"]
    for r in results:
        m = by_name.get(r.name)
        where = m.where if m else ""
        first = r.failed[0] if r.failed else ""
        rows.append(f"| {r.name} | {where} | {r.outcome} | {r.seconds:.0f} | {first} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="mutations run at once (default: 2, or 1 on one core)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutation")
    ap.add_argument("--full", action="store_true",
                    help="run each subset to the end and list every failing test")
    ap.add_argument("--tests", nargs="+", help="pytest arguments replacing the subsets")
    ap.add_argument("--baseline", action="store_true",
                    help="run the subsets on the unmutated code (they must pass)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    args = ap.parse_args(argv)
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        ap.error(f"unknown mutation(s) {', '.join(unknown)}; see --list")
    chosen = [by_name[n] for n in args.names] if args.names else list(MUTATIONS)
    if args.list:
        for m in chosen:
            print(f"{m.name:26} {m.where}\n{'':26} {m.bug}\n{'':26} tests: {' '.join(m.tests)}")
        return 0
    for m in chosen:
        check_applies(m)
    if args.baseline:
        tests = args.tests or sorted({t for m in chosen for t in m.tests})
        r = run_one(None, tests, args.timeout * 4, True, args.keep)
        print(r.log if args.verbose or r.outcome != "passed" else "", end="")
        print(f"baseline: {r.outcome} in {r.seconds:.0f} s ({' '.join(tests)})")
        return 0 if r.outcome == "passed" else 1
    t0 = time.time()
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futs = {pool.submit(run_one, m, args.tests or m.tests, args.timeout, args.full,
                            args.keep): m for m in chosen}
        for f in concurrent.futures.as_completed(futs):
            r = f.result()
            results[r.name] = r
            extra = f": {', '.join(r.failed) if args.full else (r.failed or [''])[0]}"
            print(f"{r.name:26} {r.outcome:8} {r.seconds:5.0f} s{extra}", flush=True)
            if args.verbose or r.outcome not in ("caught",):
                print(r.log[-6000:], flush=True)
    ordered = [results[m.name] for m in chosen]
    print()
    print(table(ordered, by_name))
    bad = [r.name for r in ordered if r.outcome != "caught"]
    print(f"\n{len(ordered) - len(bad)}/{len(ordered)} mutations caught in "
          f"{time.time() - t0:.0f} s" + (f"; not caught: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

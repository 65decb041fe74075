#!/usr/bin/env bash
# Installs pykittens on Debian/Ubuntu into a virtual environment beside this file (.venv), so
# the system Python is left alone (Debian 12 and Ubuntu 23.04+ refuse `pip install` into it),
# and puts a `pykittens` launcher on the PATH.
#
#   ./install.sh                  both vendors' toolchains (AMD: rocm-llvm-python + ld.lld,
#                                 NVIDIA: ptxas, cuobjdump, nvdisasm)
#   ./install.sh --amd-only       only AMD's   (CDNA code objects; Hopper stays emulated)
#   ./install.sh --nvidia-only    only NVIDIA's (Hopper code objects; CDNA stays emulated)
#   ./install.sh --test           adds pytest, hypothesis and torch (CPU) for the tests:
#                                 .venv/bin/python -m pytest -q
#
# Environment: PYTHON (the interpreter to build the environment from; default python3),
# PYKITTENS_VENV (default .venv here), PYKITTENS_BIN (where the launcher goes; default
# /usr/local/bin as root, else ~/.local/bin), PYKITTENS_APT_TIMEOUT (seconds to wait for
# another apt/dpkg to finish; default 600), PYKITTENS_TORCH_INDEX (where --test looks for a CPU
# build of torch; default https://download.pytorch.org/whl/cpu, PyPI besides).
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(pwd)"

TEST=0 AMD=1 NVIDIA=1
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    --amd-only) NVIDIA=0 ;;
    --nvidia-only) AMD=0 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (see ./install.sh --help)" >&2; exit 2 ;;
  esac
done
if [ "$AMD" = 0 ] && [ "$NVIDIA" = 0 ]; then
  echo "install.sh: --amd-only and --nvidia-only exclude each other" >&2; exit 2
fi

PYTHON="${PYTHON:-python3}"
VENV="${PYKITTENS_VENV:-$ROOT/.venv}"
APT_TIMEOUT="${PYKITTENS_APT_TIMEOUT:-600}"
TORCH_VERSION=2.13.0            # the release the tests are run with
TORCH_INDEX="${PYKITTENS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
LLD_MIN=19                      # oldest LLVM linker known to link gfx942/gfx950 code objects
APT_LOCKS="/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock"
STEP="starting"
WARNINGS=()

REPORTED=0
step() { STEP="$1"; printf '\n==> %s\n' "$1"; }
warn() { WARNINGS+=("$1"); printf 'install.sh: warning: %s\n' "$1" >&2; }
fail() { REPORTED=1; printf '\ninstall.sh: FAILED at step "%s": %s\n' "$STEP" "$1" >&2; exit 1; }
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$REPORTED" = 0 ]; then
    printf '\ninstall.sh: FAILED at step "%s" (exit status %s); the output above says why\n' \
      "$STEP" "$rc" >&2
  fi
}
trap on_exit EXIT

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi

# ---- the Python to build the environment from ------------------------------------------------
step "checking Python ($PYTHON)"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  # A minimal Debian/Ubuntu (a container image) has no Python at all: take the system's.
  if [ "$PYTHON" = python3 ] && command -v apt-get >/dev/null 2>&1 \
     && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    echo "no python3 here: installing the system's (apt-get install python3 python3-venv)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get -q -o DPkg::Lock::Timeout="$APT_TIMEOUT" update \
      || fail "apt-get update failed"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends \
      -o DPkg::Lock::Timeout="$APT_TIMEOUT" install python3 python3-venv \
      || fail "apt-get install python3 python3-venv failed"
  fi
  command -v "$PYTHON" >/dev/null 2>&1 \
    || fail "no '$PYTHON' on the PATH; install python3 (3.10 or newer) or set PYTHON"
fi
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || fail "$PYTHON is Python $PYVER; pykittens needs 3.10 or newer (set PYTHON=python3.12, say)"
ARCH="$(uname -m)"
echo "Python $PYVER ($(command -v "$PYTHON")) on $ARCH"
ROCM_WHEEL=0
case "$PYVER" in 3.11|3.12) [ "$ARCH" = x86_64 ] && [ "$(uname -s)" = Linux ] && ROCM_WHEEL=1 ;; esac
if [ "$AMD" = 1 ] && [ "$ROCM_WHEEL" = 0 ]; then
  warn "rocm-llvm-python (AMD's LLVM) has wheels for CPython 3.11/3.12 on Linux x86-64 only, not for Python $PYVER on $ARCH: AMD code objects with inline asm (pinned registers), disassembly, code-object reports and the ISA emulator will be unavailable and their tests skipped. For them, rerun with PYTHON=python3.12 (or 3.11)."
fi

# ---- system packages (apt) -------------------------------------------------------------------
lld_version_of() {  # major version of an ld.lld binary, or nothing
  "$1" --version 2>/dev/null | sed -n 's/.*LLD \([0-9][0-9]*\)\..*/\1/p' | head -n1
}

have_lld() {        # an ld.lld (LLD_MIN or newer) already installed?
  local c v
  if [ -n "${PYKITTENS_LD_LLD:-}" ]; then return 0; fi
  for c in ld.lld $(compgen -c ld.lld- 2>/dev/null | sort -u) /opt/rocm/llvm/bin/ld.lld; do
    command -v "$c" >/dev/null 2>&1 || continue
    v="$(lld_version_of "$(command -v "$c")")"
    if [ -n "$v" ] && [ "$v" -ge "$LLD_MIN" ]; then LLD_FOUND="$(command -v "$c") (LLD $v)"; return 0; fi
  done
  return 1
}

apt_wait() {        # wait until no other apt/dpkg holds its locks, or give up
  local waited=0 held
  while held="$($SUDO "$PYTHON" - $APT_LOCKS 2>/dev/null <<'EOF'
import fcntl, os, sys
for path in sys.argv[1:]:
    if os.path.exists(path):
        with open(path, "r+") as f:
            try:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                print(path)
                break
EOF
)"; [ -n "$held" ]; do
    if [ "$waited" -ge "$APT_TIMEOUT" ]; then
      fail "another package manager still holds $held after ${APT_TIMEOUT}s (an unattended upgrade?); wait for it to finish, or raise PYKITTENS_APT_TIMEOUT"
    fi
    if [ $((waited % 30)) -eq 0 ]; then
      echo "waiting for another apt/dpkg to release $held (${waited}s of at most ${APT_TIMEOUT}s)..."
    fi
    sleep 5; waited=$((waited + 5))
  done
}

APT_UPDATED=0
apt_update() {
  [ "$APT_UPDATED" = 1 ] && return 0
  apt_wait
  $SUDO apt-get -q -o DPkg::Lock::Timeout="$APT_TIMEOUT" update || fail "apt-get update failed"
  APT_UPDATED=1
}

APT_PKGS=()
need_apt() {
  command -v apt-get >/dev/null 2>&1 || return 1
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    fail "installing $* needs root (apt-get) and there is no sudo; run as root or install $* yourself"
  fi
  return 0
}

# A venv needs ensurepip, which Debian and Ubuntu ship separately (python3.X-venv).
if ! [ -x "$VENV/bin/python" ] && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  if need_apt "python$PYVER-venv"; then APT_PKGS+=("python$PYVER-venv")
  else fail "$PYTHON cannot create virtual environments (no ensurepip) and there is no apt-get; install its venv support"; fi
fi

LLD_FOUND=""
if [ "$AMD" = 1 ]; then
  step "finding LLVM's linker (ld.lld $LLD_MIN or newer, links AMD code objects)"
  if have_lld; then
    echo "using ${LLD_FOUND:-\$PYKITTENS_LD_LLD=$PYKITTENS_LD_LLD}"
  elif need_apt "lld-$LLD_MIN"; then
    apt_update
    LLD_PKG="$(apt-cache search --names-only '^lld-[0-9]+$' | sed -n 's/^lld-\([0-9][0-9]*\) .*/\1/p' \
               | sort -n | awk -v min="$LLD_MIN" '$1 >= min' | head -n1)"
    if [ -n "$LLD_PKG" ]; then
      # the oldest one offered that is new enough: lld-19 where there is one, the version the
      # tests run with
      echo "LLVM linker package: lld-$LLD_PKG"
      APT_PKGS+=("lld-$LLD_PKG")
    else
      warn "no lld-$LLD_MIN or newer in this system's package sources (Ubuntu 22.04 has lld-15 at most): AMD code objects cannot be linked and their tests are skipped. Add LLVM's apt repository and install lld-$LLD_MIN, or point PYKITTENS_LD_LLD at an ld.lld $LLD_MIN+ (e.g. ROCm's /opt/rocm/llvm/bin/ld.lld)."
    fi
  else
    warn "no apt-get here: install LLVM's ld.lld ($LLD_MIN or newer) yourself to link AMD code objects, or set PYKITTENS_LD_LLD"
  fi
fi

if [ "${#APT_PKGS[@]}" -gt 0 ]; then
  step "installing system packages: ${APT_PKGS[*]}"
  apt_update
  apt_wait
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends \
    -o DPkg::Lock::Timeout="$APT_TIMEOUT" install "${APT_PKGS[@]}" \
    || fail "apt-get install ${APT_PKGS[*]} failed"
fi

# ---- the virtual environment -----------------------------------------------------------------
step "virtual environment $VENV"
if [ -x "$VENV/bin/python" ]; then
  HAVE="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
  if [ "$HAVE" != "$PYVER" ]; then
    echo "it holds Python ${HAVE:-?}, not $PYVER: making it anew"
    rm -rf "$VENV"
  else
    echo "reusing it (Python $HAVE)"
  fi
elif [ -e "$VENV" ]; then
  echo "an incomplete environment is there: making it anew"
  rm -rf "$VENV"
fi
if ! [ -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" || fail "$PYTHON -m venv $VENV failed"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip --version >/dev/null 2>&1 || fail "the environment has no pip ($VPY -m pip)"

extras=()
[ "$AMD" = 1 ] && extras+=(amd)
[ "$NVIDIA" = 1 ] && extras+=(nvidia)
[ "$TEST" = 1 ] && extras+=(test)
spec=".[$(IFS=,; echo "${extras[*]}")]"

if [ "$TEST" = 1 ] && ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  step "installing torch $TORCH_VERSION, CPU build (the torch operators are tested on CPU tensors)"
  # PyTorch's own index has CPU-only builds (about 200 MB); PyPI's Linux torch brings the CUDA
  # libraries (several GB). Where the index answers, pip takes its CPU build (2.13.0+cpu ranks
  # above 2.13.0); else torch comes from pip's configured indexes. If that version cannot be
  # had, any torch >= 2.5.
  torch_src=()
  if "$VPY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=20)' \
       "$TORCH_INDEX" >/dev/null 2>&1; then
    torch_src=(--extra-index-url "$TORCH_INDEX")
    echo "CPU builds from $TORCH_INDEX"
  else
    echo "$TORCH_INDEX cannot be reached from here: torch comes from pip's configured indexes (PyPI's Linux build includes the CUDA libraries, several GB)"
  fi
  "$VPY" -m pip install "${torch_src[@]}" "torch==$TORCH_VERSION" \
    || "$VPY" -m pip install "${torch_src[@]}" "torch>=2.5" \
    || fail "pip could not install torch"
fi

step "installing pykittens $spec (editable) and its Python dependencies"
"$VPY" -m pip install -e "$spec" || fail "pip install -e '$spec' failed"

# ---- the launcher ----------------------------------------------------------------------------
step "putting the pykittens command on the PATH"
if [ -n "${PYKITTENS_BIN:-}" ]; then BIN="$PYKITTENS_BIN"
elif [ "$(id -u)" -eq 0 ]; then BIN=/usr/local/bin
else BIN="$HOME/.local/bin"; fi
LAUNCHER="$BIN/pykittens"
MARK="# pykittens launcher written by install.sh"
if [ -e "$LAUNCHER" ] && ! grep -qF "$MARK" "$LAUNCHER" 2>/dev/null; then
  warn "$LAUNCHER exists and is not install.sh's launcher: left alone; run $VENV/bin/pykittens, or set PYKITTENS_BIN"
else
  mkdir -p "$BIN" && printf '#!/bin/sh\n%s (%s)\nexec "%s" "$@"\n' "$MARK" "$ROOT" "$VENV/bin/pykittens" > "$LAUNCHER" \
    && chmod 755 "$LAUNCHER" || fail "could not write $LAUNCHER (set PYKITTENS_BIN to a writable folder on the PATH)"
  echo "$LAUNCHER -> $VENV/bin/pykittens"
  case ":$PATH:" in
    *":$BIN:"*) first="$(command -v pykittens || true)"
      if [ -n "$first" ] && [ "$first" != "$LAUNCHER" ]; then
        warn "'pykittens' on this PATH is $first, which comes before $LAUNCHER"
      fi ;;
    *) warn "$BIN is not on the PATH: add it (export PATH=\"$BIN:\$PATH\") or run $VENV/bin/pykittens" ;;
  esac
fi

# ---- what this install can do ----------------------------------------------------------------
step "checking the toolchains"
"$VPY" - <<'EOF' || fail "pykittens does not import in the environment"
from pykittens.toolchain import tools
for t in tools.status():
    print(f"  {'ok  ' if t.found else 'MISSING'} {t.name:<17} {t.purpose}"
          + ("" if t.found else f"\n          -> {t.hint}"))
EOF

printf '\npykittens is installed in %s.\n' "$VENV"
if [ "$AMD" = 0 ]; then echo "NVIDIA toolchain only (--nvidia-only): CDNA kernels are emulated, not compiled."; fi
if [ "$NVIDIA" = 0 ]; then echo "AMD toolchain only (--amd-only): Hopper kernels are emulated, not compiled."; fi
if [ "${#WARNINGS[@]}" -gt 0 ]; then
  echo "with ${#WARNINGS[@]} warning(s):"
  for w in "${WARNINGS[@]}"; do echo "  - $w"; done
fi
echo "Run:  pykittens demo"
if [ "$TEST" = 1 ]; then echo "Test: $VENV/bin/python -m pytest -q"; fi
exit 0

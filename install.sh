#!/usr/bin/env bash
# Installs pykittens and what it needs on Debian/Ubuntu: ld.lld (Debian's lld-19, links AMD
# code objects) and the Python package with its PyPI dependencies.  --test adds pytest,
# hypothesis and torch (the torch operators are tested on CPU tensors).
set -euo pipefail
cd "$(dirname "$0")"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
if ! command -v ld.lld-19 >/dev/null 2>&1 && ! command -v ld.lld >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq lld-19 >/dev/null
  else
    echo "install.sh: no apt-get: install LLVM's ld.lld (19 or newer) yourself to build AMD code objects" >&2
  fi
fi
if [ -n "$extras" ] && ! python3 -c "import torch" >/dev/null 2>&1; then
  # the op tests run torch on the CPU: one known release (pip takes a local CPU wheel of it
  # where its configuration offers one), else any torch >= 2.5
  python3 -m pip install -q "torch==2.13.0" || python3 -m pip install -q "torch>=2.5"
fi
python3 -m pip install -q -e ".${extras}"

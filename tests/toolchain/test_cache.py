"""The code-object cache: checksummed entries (a truncated or corrupted file is a miss and
is rebuilt), keys that change with everything that changes the bytes, and writers that
never expose half a file to concurrent readers."""
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import pykittens
from pykittens.toolchain import amdgpu, cache, nvptx

IR_AMD = """
target triple = "amdgcn-amd-amdhsa"
declare i32 @llvm.amdgcn.workitem.id.x()
define amdgpu_kernel void @inc(ptr addrspace(1) %x) {
  %t = call i32 @llvm.amdgcn.workitem.id.x()
  %p = getelementptr i32, ptr addrspace(1) %x, i32 %t
  %v = load i32, ptr addrspace(1) %p
  %w = add i32 %v, 1
  store i32 %w, ptr addrspace(1) %p
  ret void
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKITTENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def entry(kind, key):
    return cache.cache_dir() / kind / key


def test_round_trip_and_header():
    key = cache.cache_key("unit", "a")
    path = cache.store("unit", key, b"payload")
    assert cache.lookup("unit", key) == b"payload"
    raw = path.read_bytes()
    assert raw.endswith(b"payload") and len(raw) > len(b"payload")   # header + payload
    assert cache.lookup("unit", cache.cache_key("unit", "b")) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "old-format", "garbage-tail"])
def test_damaged_entries_are_misses_and_removed(damage):
    key = cache.cache_key("unit", damage)
    path = cache.store("unit", key, b"x" * 1000)
    raw = path.read_bytes()
    bad = {"truncate": raw[:-10], "flip": raw[:-1] + bytes([raw[-1] ^ 1]), "empty": b"",
           "old-format": b"x" * 1000, "garbage-tail": raw + b"junk"}[damage]
    path.write_bytes(bad)
    assert cache.lookup("unit", key) is None
    assert not path.exists()                  # removed, so the rebuild replaces it
    cache.store("unit", key, b"x" * 1000)
    assert cache.lookup("unit", key) == b"x" * 1000


def test_keys_cover_the_format_and_pykittens_version(monkeypatch):
    k = cache.cache_key("hsaco", "ir", "gfx942")
    assert cache.cache_key("hsaco", "ir", "gfx943") != k
    assert cache.cache_key("hsaco", "ir" + "gfx942") != cache.cache_key("hsaco", "irgfx", "942")
    monkeypatch.setattr(pykittens, "__version__", "99.0")
    assert cache.cache_key("hsaco", "ir", "gfx942") != k
    monkeypatch.setattr(cache, "FORMAT", cache.FORMAT + 1)
    assert cache.cache_key("hsaco", "ir", "gfx942") != k


def test_amd_objects_rebuild_after_corruption_and_key_on_passes_and_link_flags(
        monkeypatch, private_cache):
    obj = amdgpu.compile_ir(IR_AMD, "gfx942")
    (path,) = (private_cache / "hsaco").iterdir()
    path.write_bytes(path.read_bytes()[:100])          # a writer killed half-way, say
    assert amdgpu.compile_ir(IR_AMD, "gfx942") == obj  # detected, rebuilt, same bytes
    assert cache.lookup("hsaco", path.name) == obj     # and the entry repaired
    # what pykittens asks of LLVM and the linker is part of the key
    monkeypatch.setattr(amdgpu, "LINK_FLAGS", amdgpu.LINK_FLAGS + ("--build-id=none",))
    amdgpu.compile_ir(IR_AMD, "gfx942")
    assert len(list((private_cache / "hsaco").iterdir())) == 2
    monkeypatch.setattr(amdgpu, "PIPELINE_VERSION", amdgpu.PIPELINE_VERSION + 1)
    amdgpu.compile_ir(IR_AMD, "gfx942")
    assert len(list((private_cache / "hsaco").iterdir())) == 3


def test_ptx_rebuilds_after_corruption(private_cache):
    ir = ('target triple = "nvptx64-nvidia-cuda"\n'
          "define ptx_kernel void @k(ptr addrspace(1) %x) {\n"
          "  store i32 1, ptr addrspace(1) %x\n  ret void\n}\n")
    ptx = nvptx.compile_ptx(ir, "sm_90a")
    (path,) = (private_cache / "ptx").iterdir()
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert nvptx.compile_ptx(ir, "sm_90a") == ptx


def test_concurrent_writers_and_readers_see_whole_entries(private_cache):
    """Eight writers store payloads of different sizes under one key while readers look it
    up: every read is a complete payload (or a miss before the first write), and no
    temporary file is left behind."""
    key = cache.cache_key("unit", "race")
    payloads = [bytes([i]) * (1000 + 997 * i) for i in range(8)]
    stop = threading.Event()
    seen, bad = set(), []

    def writer(i):
        for _ in range(25):
            cache.store("unit", key, payloads[i])

    def reader():
        while not stop.is_set():
            got = cache.lookup("unit", key)
            if got is not None:
                (seen.add(got) if got in payloads else bad.append(len(got)))

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for r in readers:
        r.start()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(writer, range(8)))
    stop.set()
    for r in readers:
        r.join()
    assert not bad and seen
    assert cache.lookup("unit", key) in payloads
    assert os.listdir(private_cache / "unit") == [key]

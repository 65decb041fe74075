"""Benchmark and device-check harness (needs torch and a GPU): timing with CUDA graphs,
library kernels against float64 references and against the emulator, copy ceilings.
The scripts in bench/ and `pykittens demo` (when a GPU is present) use it."""

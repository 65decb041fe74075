"""The instruction-level emulator for CDNA code objects (gfx942, gfx950): it executes the
code LLVM made for a kernel, instruction by instruction, with semantics written from
AMD's ISA documents, and checks the wait states the hardware does not enforce. The lane
emulator checks what a kernel means; this checks what the GPU would run.

    res = pykittens.isa.emulate(kernel, *args, grid=..., target="gfx950")
    violations = pykittens.isa.check_hazards(asm_text, "gfx950")
"""
from .dispatch import emulate, run
from .hazards import RULES, Violation, check_hazards
from .machine import Program, program
from .state import ISAError

__all__ = ["ISAError", "Program", "RULES", "Violation", "check_hazards", "emulate",
           "program", "run"]

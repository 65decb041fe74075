"""Resource reports and instruction mix from code objects."""
from .hsaco import KernelInfo, code_object_version, kernels, metadata, report
from .occupancy import Occupancy, waves_per_simd

__all__ = ["KernelInfo", "Occupancy", "code_object_version", "kernels", "metadata", "report",
           "waves_per_simd"]

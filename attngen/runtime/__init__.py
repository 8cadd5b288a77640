"""Run generated kernels on torch tensors: the GPU (driver, devices), the loaded bundle and its
launch (kernel.py), and one module per call convention (calls/).

Nothing here imports torch at module import time: the CPU-only install has none.
"""
from __future__ import annotations

from .gpu import InputError, check_errors, device_arch, device_info, error_word, gpu_modules
from .calls import kernel_class, load
from .kernel import Kernel, LaunchError, bundle_of, default_scale, to_bhsd

__all__ = ["InputError", "Kernel", "LaunchError", "bundle_of", "check_errors", "default_scale", "device_arch",
           "device_info", "error_word", "gpu_modules", "kernel_class", "load", "to_bhsd"]

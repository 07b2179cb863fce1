"""DeepGEMM's deep_gemm.testing over xte: calc_diff, count_bytes, assert_bitwise_equal,
get_arch_major, test_filter / ignore_env, and timing-only bench / bench_kineto (wall-clock
means on the CPU; kernel names are accepted for the signature, not matched against a profile).
"""

import functools
import os
import time

import torch

from ..testing import calc_diff

__all__ = ["calc_diff", "count_bytes", "assert_bitwise_equal", "get_arch_major", "test_filter",
           "ignore_env", "bench", "bench_kineto"]

# The feature set xte.deep_gemm implements is DeepGEMM's SM100 one (MN-major operands, fp32
# output, k-grouped and PSUM layouts), so code that branches on the architecture takes those
# paths.
_ARCH_MAJOR = 10


def get_arch_major() -> int:
    return _ARCH_MAJOR


def count_bytes(*tensors):
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = ""):
    assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, x.dtype, y.shape, y.dtype)
    xb = x.contiguous().view(torch.uint8).flatten()
    yb = y.contiguous().view(torch.uint8).flatten()
    if torch.equal(xb, yb):
        return
    i = int((xb != yb).nonzero()[0].item())
    raise AssertionError(f"bitwise mismatch{f' ({label})' if label else ''}: "
                         f"{int((xb != yb).sum())} of {xb.numel()} bytes differ, first at byte "
                         f"{i} (element {i // x.element_size()})")


def test_filter(condition):
    def deco(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if condition():
                return func(*args, **kwargs)
            print(f"{func.__name__}:\n > Filtered by {condition}\n")
        return wrapper
    return deco


setattr(test_filter, "__test__", False)  # not a pytest test


def ignore_env(name: str, condition):
    def deco(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not condition():
                return func(*args, **kwargs)
            saved = os.environ.pop(name, None)
            try:
                return func(*args, **kwargs)
            finally:
                if saved is not None:
                    os.environ[name] = saved
        return wrapper
    return deco


def bench(fn, num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False):
    """Mean wall-clock seconds of fn() over num_tests calls after num_warmups."""
    for _ in range(num_warmups):
        fn()
    t0 = time.perf_counter()
    for _ in range(num_tests):
        fn()
    return (time.perf_counter() - t0) / max(num_tests, 1)


def bench_kineto(fn, kernel_names, num_tests: int = 30, suppress_kineto_output: bool = False,
                 trace_path=None, flush_l2: bool = True, with_multiple_kernels: bool = False):
    """Timing-only stand-in for DeepGEMM's profiler-based bench_kineto: one warm-up call, then
    the mean wall-clock seconds of fn() over num_tests calls, returned once per kernel name (a
    tuple for a tuple of names, as DeepGEMM). No per-kernel breakdown on the CPU."""
    if not (isinstance(kernel_names, str) or isinstance(kernel_names, tuple)):
        raise TypeError("bench_kineto: kernel_names is a str or a tuple of str")
    fn()
    t0 = time.perf_counter()
    for _ in range(num_tests):
        fn()
    t = (time.perf_counter() - t0) / max(num_tests, 1)
    return tuple(t for _ in kernel_names) if isinstance(kernel_names, tuple) else t

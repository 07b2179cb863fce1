"""transformer_engine.pytorch.utils over xte (the helpers users call)."""
import torch

__all__ = ["get_device_compute_capability", "is_bf16_available", "get_cudnn_version"]


def get_device_compute_capability():
    """(major, minor) of the current CUDA device; (0, 0) without one (xte runs on the CPU)."""
    if torch.cuda.is_available():
        return tuple(torch.cuda.get_device_capability())
    return (0, 0)


def is_bf16_available(return_reason=False):
    """bf16 is always available to xte (CPU kernels; the CUDA plugin)."""
    return (True, "") if return_reason else True


def get_cudnn_version():
    """xte does not use cuDNN."""
    raise NotImplementedError("xte: no cuDNN (get_cudnn_version)")

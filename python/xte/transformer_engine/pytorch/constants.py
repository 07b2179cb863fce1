"""transformer_engine.pytorch.constants over xte: TE's DType tags (same integer values as TE's
backend enum) and the torch dtype <-> DType maps."""
import enum

import torch

__all__ = ["DType", "TE_DType", "TE_DType_To_Torch", "GemmParallelModes", "dist_group_type",
           "MXFP8_BLOCK_SCALING_SIZE", "NVFP4_BLOCK_SCALING_SIZE"]


class DType(enum.IntEnum):
    """TransformerEngine's tensor dtype tags (values of TE's NVTEDType)."""
    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10

    @classmethod
    def cast(cls, dtype):
        """The DType of a DType or of its integer value."""
        return dtype if isinstance(dtype, cls) else cls(int(dtype))


TE_DType = {
    torch.uint8: DType.kByte,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
    torch.int32: DType.kInt32,
    torch.float32: DType.kFloat32,
    torch.half: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
}

TE_DType_To_Torch = {v: k for k, v in TE_DType.items()}

GemmParallelModes = ("row", "column", None)

dist_group_type = torch.distributed.ProcessGroup if torch.distributed.is_available() else object

MXFP8_BLOCK_SCALING_SIZE = 32

NVFP4_BLOCK_SCALING_SIZE = 16

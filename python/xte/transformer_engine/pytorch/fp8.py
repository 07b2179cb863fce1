"""transformer_engine.pytorch.fp8 over xte: the older module name of quantization.py (TE
releases before 2.8 kept fp8_autocast, FP8GlobalStateManager and the availability queries
here)."""
from .quantization import *  # noqa: F401,F403
from .quantization import __all__  # noqa: F401

"""transformer_engine.pytorch.quantization over xte: the autocast context TE users write
(`autocast(enabled, calibrating, recipe, amax_reduction_group)` and the deprecated
`fp8_autocast(enabled, calibrating, fp8_recipe, fp8_group)`), the availability queries and the
recipe helpers.

xte runs Float8BlockScaling, Float8CurrentScaling and MXFP8BlockScaling in its modules (on the
CPU and through the CUDA plugin); DelayedScaling (amax history), NVFP4BlockScaling (FP4) and
CustomRecipe raise NotImplementedError when an enabled autocast is entered with them. The
default recipe (recipe=None) is Float8BlockScaling()."""
import contextlib
import warnings
from typing import Any, Optional

import torch

from ...recipe import (Float8BlockScaling, Format, MXFP8BlockScaling, Recipe)
from .constants import DType

__all__ = ["autocast", "fp8_autocast", "fp8_model_init", "quantized_model_init",
           "is_fp8_available", "is_mxfp8_available", "is_fp8_block_scaling_available",
           "is_nvfp4_available", "get_default_recipe", "get_default_fp8_recipe",
           "get_fp8_torch_dtype", "get_fp8_te_dtype", "get_fp8_max", "check_recipe_support",
           "get_align_size_for_quantization", "FP8GlobalStateManager"]


def _yes(return_reason):
    return (True, "") if return_reason else True


def is_fp8_available(return_reason=False):
    """FP8 (per-tensor current scaling) is available: xte's kernels run on the CPU."""
    return _yes(return_reason)


def is_mxfp8_available(return_reason=False):
    """MXFP8 (1x32 blocks, E8M0 scales) is available."""
    return _yes(return_reason)


def is_fp8_block_scaling_available(return_reason=False):
    """FP8 block scaling (1x128 / 128x128) is available."""
    return _yes(return_reason)


def is_nvfp4_available(return_reason=False):
    """NVFP4 is not: FP4 (E2M1) is out of xte's scope."""
    reason = "xte: NVFP4 (FP4, E2M1) is out of xte's scope"
    return (False, reason) if return_reason else False


def get_default_fp8_recipe() -> Recipe:
    """xte's default recipe: Float8BlockScaling() (TE picks by GPU generation)."""
    return Float8BlockScaling()


get_default_recipe = get_default_fp8_recipe


def get_align_size_for_quantization(recipe: Recipe) -> int:
    """Row alignment of grouped quantized operands (TE's values): a custom recipe's
    quantization_alignment, 32 for MXFP8, 128 for NVFP4, else 16."""
    if recipe.custom():
        return getattr(recipe, "quantization_alignment")  # CustomRecipe's field
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16


def _fwd_e4m3(recipe, fprop_tensor):
    return recipe.fp8_format == Format.E4M3 or (recipe.fp8_format == Format.HYBRID
                                                and fprop_tensor)


def get_fp8_torch_dtype(fp8_recipe: Optional[Recipe], fprop_tensor: bool = True) -> torch.dtype:
    """torch.float8_e4m3fn or torch.float8_e5m2 for a recipe's forward / backward tensors."""
    return torch.float8_e4m3fn if _fwd_e4m3(fp8_recipe, fprop_tensor) else torch.float8_e5m2


def get_fp8_te_dtype(fp8_recipe: Optional[Recipe], fprop_tensor: bool = True):
    """DType.kFloat8E4M3 or kFloat8E5M2 for a recipe's forward / backward tensors."""
    return DType.kFloat8E4M3 if _fwd_e4m3(fp8_recipe, fprop_tensor) else DType.kFloat8E5M2


def get_fp8_max(fp8_recipe: Optional[Recipe], fprop_tensor: bool = True) -> float:
    """Largest finite value of the recipe's forward / backward FP8 format."""
    return (Format.E4M3 if _fwd_e4m3(fp8_recipe, fprop_tensor) else Format.E5M2).value.max_fwd


def check_recipe_support(recipe: Optional[Recipe]) -> None:
    """Raise NotImplementedError for a recipe xte's modules cannot run."""
    if recipe is None:
        return
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: expected a transformer_engine.common.recipe object, got "
                        f"{type(recipe).__name__}")
    if recipe.nvfp4():
        raise NotImplementedError("xte: NVFP4BlockScaling (FP4, E2M1) is out of xte's scope")
    if recipe.custom():
        raise NotImplementedError("xte: CustomRecipe (user quantizer factories) is not "
                                  "supported by xte's modules")
    if recipe.delayed():
        raise NotImplementedError("xte: DelayedScaling (per-tensor scales from an amax history) "
                                  "is not supported by xte's modules; use Float8CurrentScaling "
                                  "or Float8BlockScaling")
    override = getattr(recipe, "backward_override", None)
    if override is not None:
        raise NotImplementedError(f"xte: backward_override={override!r} is not supported")
    if isinstance(recipe, MXFP8BlockScaling) and getattr(recipe, "enable_2d_quantization",
                                                         False):
        raise NotImplementedError("xte: MXFP8BlockScaling(enable_2d_quantization=True) (2-D "
                                  "MXFP8 weight blocks) is not supported")
    if getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False):
        raise NotImplementedError("xte: fp8_dpa / fp8_mha (FP8 attention) is not supported")
    if recipe.xte_recipe is None:
        raise NotImplementedError(f"xte: recipe {type(recipe).__name__} is not supported by "
                                  "xte's modules")


class FP8GlobalStateManager:
    """The autocast state the modules read (TE's class of the same name, reduced to what xte
    uses: no amax buffers, xte keeps no amax history)."""

    FP8_ENABLED = False
    FP8_CALIBRATION = False
    FP8_RECIPE = None
    FP8_DISTRIBUTED_GROUP = None
    FP8_PARAMETERS = False
    AUTOCAST_DEPTH = 0

    @classmethod
    def reset(cls) -> None:
        cls.FP8_ENABLED = False
        cls.FP8_CALIBRATION = False
        cls.FP8_RECIPE = None
        cls.FP8_DISTRIBUTED_GROUP = None
        cls.AUTOCAST_DEPTH = 0

    @classmethod
    def is_fp8_available(cls):
        return is_fp8_available(True)

    @classmethod
    def is_mxfp8_available(cls):
        return is_mxfp8_available(True)

    @classmethod
    def is_fp8_block_scaling_available(cls):
        return is_fp8_block_scaling_available(True)

    @classmethod
    def is_nvfp4_available(cls):
        return is_nvfp4_available(True)

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return cls.FP8_ENABLED

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return cls.FP8_CALIBRATION

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return cls.FP8_PARAMETERS

    @classmethod
    def get_fp8_recipe(cls) -> Optional[Recipe]:
        return cls.FP8_RECIPE if cls.FP8_RECIPE is not None else get_default_fp8_recipe()

    @classmethod
    def get_fp8_group(cls):
        return cls.FP8_DISTRIBUTED_GROUP

    @classmethod
    def get_autocast_state(cls):
        return (cls.FP8_ENABLED, cls.FP8_CALIBRATION, cls.FP8_RECIPE, cls.FP8_DISTRIBUTED_GROUP,
                cls.AUTOCAST_DEPTH)

    @classmethod
    def set_autocast_state(cls, state: Any):
        (cls.FP8_ENABLED, cls.FP8_CALIBRATION, cls.FP8_RECIPE, cls.FP8_DISTRIBUTED_GROUP,
         cls.AUTOCAST_DEPTH) = state

    @classmethod
    def autocast_enter(cls, enabled: bool = False, calibrating: bool = False,
                       fp8_recipe: Optional[Recipe] = None, fp8_group: Any = None,
                       _graph: bool = False):
        cls.FP8_ENABLED = bool(enabled)
        cls.FP8_CALIBRATION = bool(calibrating)
        cls.FP8_RECIPE = get_default_fp8_recipe() if fp8_recipe is None else fp8_recipe
        cls.FP8_DISTRIBUTED_GROUP = fp8_group
        cls.AUTOCAST_DEPTH += 1

    @classmethod
    def autocast_exit(cls, enabled: bool, _graph: bool = False):
        pass


class autocast:
    """Context manager for FP8 execution of the modules inside (TE's autocast):
    `with autocast(enabled=True, recipe=Float8BlockScaling()): y = model(x)`. Outside (or with
    enabled=False) the modules compute in their parameters' precision. recipe=None: xte's
    default, Float8BlockScaling(). An enabled autocast with a recipe xte cannot run raises
    NotImplementedError on entry. calibrating has no effect (xte keeps no amax statistics);
    amax_reduction_group is stored only (xte's block and current scaling need no reduction
    inside one process)."""

    __slots__ = ("_enabled", "_calibrating", "_recipe", "_amax_reduction_group", "_graph",
                 "_fp8_state")

    def __init__(self, enabled: bool = True, calibrating: bool = False,
                 recipe: Optional[Recipe] = None, amax_reduction_group: Any = None,
                 _graph: bool = False) -> None:
        self._enabled = enabled
        self._calibrating = calibrating
        self._recipe = recipe
        self._amax_reduction_group = amax_reduction_group
        self._graph = _graph
        self._fp8_state = None

    def __enter__(self):
        if self._fp8_state is not None:
            raise RuntimeError("autocast context manager cannot be entered more than once "
                               "concurrently")
        if self._enabled:
            check_recipe_support(self._recipe)
        self._fp8_state = FP8GlobalStateManager.get_autocast_state()
        FP8GlobalStateManager.autocast_enter(enabled=self._enabled,
                                             calibrating=self._calibrating,
                                             fp8_recipe=self._recipe,
                                             fp8_group=self._amax_reduction_group,
                                             _graph=self._graph)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        try:
            FP8GlobalStateManager.set_autocast_state(self._fp8_state)
            FP8GlobalStateManager.autocast_exit(self._enabled, _graph=self._graph)
        finally:
            self._fp8_state = None


def fp8_autocast(enabled: bool = True, calibrating: bool = False,
                 fp8_recipe: Optional[Recipe] = None, fp8_group: Any = None,
                 _graph: bool = False) -> "autocast":
    """TE's deprecated spelling of autocast (it warns as TE does)."""
    warnings.warn("fp8_autocast is deprecated and will be removed in a future release. Use "
                  "autocast(enabled=..., calibrating=..., recipe=..., group=..., _graph=...) "
                  "instead.", category=DeprecationWarning, stacklevel=2)
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe,
                    amax_reduction_group=fp8_group, _graph=_graph)


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                         preserve_high_precision_init_val: bool = False):
    """TE's FP8 primary weights: xte's modules keep high-precision parameters and quantize them
    on every forward, so enabled=True raises NotImplementedError; enabled=False is a no-op."""
    if enabled:
        raise NotImplementedError("xte: quantized_model_init / fp8_model_init (FP8 primary "
                                  "weights) is not supported; parameters stay in params_dtype")
    yield


def fp8_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                   preserve_high_precision_init_val: bool = False):
    """Deprecated name of quantized_model_init."""
    return quantized_model_init(enabled, recipe, preserve_high_precision_init_val)



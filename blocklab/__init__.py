"""blocklab: the transformer block you can see, train, ablate and load real weights into."""

from .activations import ACTIVATION_NAMES, get_activation
from .attention import MultiHeadAttention
from .block import Residual, TransformerBlock
from .cache import ActivationCache, run_with_cache
from .config import PRESETS, ModelConfig, preset
from .feedforward import FeedForward
from .hooks import TRANSFORMERLENS_ALIASES, HookPoint, hooks
from .load import Loaded, load
from .model import IGNORE_INDEX, Transformer
from .nonfinite import NonFiniteError, detect_nonfinite, find_first_nonfinite
from .norms import LayerNorm, layer_norm_stats
from .params import ParamCount, count_parameters
from .resources import estimate_memory
from .version import __version__

__all__ = [
    "ACTIVATION_NAMES",
    "ActivationCache",
    "IGNORE_INDEX",
    "PRESETS",
    "TRANSFORMERLENS_ALIASES",
    "FeedForward",
    "HookPoint",
    "LayerNorm",
    "Loaded",
    "ModelConfig",
    "MultiHeadAttention",
    "NonFiniteError",
    "ParamCount",
    "Residual",
    "Transformer",
    "TransformerBlock",
    "count_parameters",
    "detect_nonfinite",
    "estimate_memory",
    "find_first_nonfinite",
    "get_activation",
    "hooks",
    "layer_norm_stats",
    "load",
    "preset",
    "run_with_cache",
    "__version__",
]

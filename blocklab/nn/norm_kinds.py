"""Every norm kind as data (docs/concepts.md#layer-normalization): the one table that names a norm.

A norm kind is what ``ModelConfig.norm`` chooses. For the kinds that normalise each position on its own
(``statistics="position"``) the record is the whole definition; for a vector z of size d:

    mu    = mean(z) if centres else 0
    var   = mean((z - mu)^2)                    (biased; "ms", the mean square, when the kind does not centre)
    denom = sqrt(var + eps) if eps_inside_root else sqrt(var) + eps
    out   = (offset + w) * (z - mu) / denom + beta      gamma = offset + w, w initialised to 1 - offset

so a new LayerNorm-like kind (Gemma's RMSNorm with gamma = 1 + w, OLMo's LayerNorm with no parameters)
is one entry below and nothing else. BatchNorm (``statistics="batch"``) has its own module
(batchnorm.py); ``statistics=None`` is no norm at all.

Everything that depends on a norm's kind reads this table: the config (the allowed names and the rules
that need a norm, or a per-position one), the modules and their lean kernels (norms.py, kernels.py: the
forward and backward follow ``centres`` and ``eps_inside_root``), the parameter count, ``fold_ln`` and
``center_writing_weights`` (circuits.py), diagnostics, the tracer's labels, tables and sentences, the
CLI's help and the docs.

Torch-free: config imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NormKind:
    """One ``ModelConfig.norm`` value and everything its consumers ask of it; ``explains`` is its formula
    in words."""

    name: str  # the ModelConfig.norm value
    label: str  # the norm's name in words: the tracer's labels and sentences ("RMSNorm")
    symbol: str  # the norm in a block's formula ("LN1(x)", "RMS1(x)"); "" for no norm (the identity)
    # the tracer's sentence after "{label}: ", with {span} (the range of var / denom^2 over positions)
    # and {eps}; for a kind without per-position numbers ({statistics} not "position"), the whole sentence
    explains: str
    statistics: str | None = "position"  # over what mu and var are taken: "position", "batch", None (no norm)
    centres: bool = True  # subtracts the mean (RMSNorm does not)
    eps_inside_root: bool = True  # sqrt(var + eps); False: sqrt(var) + eps
    scale: bool = True  # a learned gamma (OLMo's non-parametric LayerNorm has none)
    scale_offset: float = 0.0  # gamma = scale_offset + weight (Gemma: 1 + w, the weight initialised 0)
    bias: bool = True  # a beta when ModelConfig.bias is true (RMSNorm never has one)
    # TransformerLens' normalization_type for this kind ("LN", "RMS"; None: no norm), where it has one
    transformerlens: str | None = None
    in_transformerlens: bool = False  # whether TransformerLens has the kind at all

    @property
    def normalises(self) -> bool:
        """Whether there is a norm at all (``none`` is the identity)."""
        return self.statistics is not None

    @property
    def per_position(self) -> bool:
        """Each position normalised on its own (a LayerNorm kind): its statistics are the tracer's,
        QK-norm may use it, ``fold_ln`` may fold it."""
        return self.statistics == "position"

    def has_bias(self, bias: bool) -> bool:
        """Whether a norm of this kind gets a beta when the config's ``bias`` is ``bias``."""
        return self.normalises and bias and self.bias

    def parameters(self, d: int, bias: bool) -> int:
        """Parameters of one norm d wide: gamma (d, when it has one) and beta (d, when it has one)."""
        return d * (int(self.normalises and self.scale) + int(self.has_bias(bias)))

    def parameters_in_words(self, bias: bool) -> str:
        """``parameters`` as the CLI's formula column says it: "2d", "d" or "0"."""
        n = int(self.normalises and self.scale) + int(self.has_bias(bias))
        return {0: "0", 1: "d"}.get(n, f"{n}d")

    @property
    def var_name(self) -> str:
        """What the tracer calls the second statistic: the variance, or the mean square when not centring."""
        return "var" if self.centres else "ms"

    @property
    def denominator(self) -> str:
        """The denominator as the tracer's table heads it: sqrt(var+eps), sqrt(var)+eps, sqrt(ms+eps)."""
        return f"sqrt({self.var_name}+eps)" if self.eps_inside_root else f"sqrt({self.var_name})+eps"


NORM_KINDS: dict[str, NormKind] = {
    kind.name: kind for kind in (
        NormKind(
            "standard", "LayerNorm", "LN",
            "subtracted each position's mean mu and divided by sqrt(var + eps); z_hat has mean 0 and "
            "variance var/(var+eps) = {span}, under 1 only because eps = {eps} is added to var (var divides "
            "by d, not d-1); then gamma * z_hat + beta",
            transformerlens="LN", in_transformerlens=True,
        ),
        NormKind(
            "eps_outside_sqrt", "LayerNorm (eps outside the root)", "LN",
            "(z - mu) / (sqrt(var) + eps); z_hat has mean 0 and variance var/(sqrt(var)+eps)^2 = {span}, "
            "under 1 only because of eps = {eps}; then gamma * z_hat + beta",
            eps_inside_root=False,
        ),
        NormKind(
            "rms", "RMSNorm", "RMS",
            "divided each position by sqrt(mean(z^2) + eps), no centring; mean(z_hat^2) = ms/(ms+eps) = "
            "{span}, under 1 only by eps = {eps}; then gamma * z_hat",
            centres=False, bias=False, transformerlens="RMS", in_transformerlens=True,
        ),
        NormKind(  # Gemma's RMSNorm (transformers' GemmaRMSNorm): output * (1 + weight), weight from 0
            "rms_plus_one", "RMSNorm (1 + w)", "RMS",
            "divided each position by sqrt(mean(z^2) + eps), no centring; mean(z_hat^2) = ms/(ms+eps) = "
            "{span}, under 1 only by eps = {eps}; then (1 + w) * z_hat, w learned from 0 (Gemma)",
            centres=False, bias=False, scale_offset=1.0,
        ),
        NormKind(  # OLMo's (transformers' OlmoLayerNorm): LayerNorm with no gamma and no beta
            "nonparametric", "LayerNorm (no parameters)", "LN",
            "subtracted each position's mean mu and divided by sqrt(var + eps); z_hat has mean 0 and "
            "variance var/(var+eps) = {span}, under 1 only because eps = {eps} is added to var; no gamma, no "
            "beta (OLMo): z_hat is the output",
            scale=False, bias=False, transformerlens="LN", in_transformerlens=True,
        ),
        NormKind(
            "batch", "BatchNorm", "BN",
            "each feature normalized with statistics over batch and positions (running estimates in eval), "
            "not per position, so rows need not have mean 0, variance 1",
            statistics="batch",
        ),
        NormKind(
            "none", "no norm", "",
            "no norm here (norm='none'): the values pass through unchanged",
            statistics=None, scale=False, bias=False, in_transformerlens=True,
        ),
    )
}


def layer_norm_variants() -> tuple[str, ...]:
    """The per-position kinds (LayerNorm's variants), what QK-norm and the lean kernels take; read from the
    table each time, so that a record added to it is one of them."""
    return tuple(name for name, kind in NORM_KINDS.items() if kind.per_position)


def is_layer_norm(name: object) -> bool:
    """Whether ``name`` is a per-position norm kind."""
    kind = NORM_KINDS.get(name) if isinstance(name, str) else None
    return kind is not None and kind.per_position

"""Every block layout as data (docs/concepts.md#the-block): the one table that names a layout.

A layout is its steps in forward order; each step computes one stage of the block from earlier ones:

    Norm("ln1", reads="resid_pre")                     ln1 = LN1(resid_pre)
    Sublayer("attn", reads="ln1")                      attn.q ... attn.out = MHA(ln1)
    Sum("resid_mid", "resid_pre", ("attn.out",), "res1")  resid_mid = combine(resid_pre, attn.out)

The block's input is the stage ``resid_pre``; its output is the last step's stage. A ``Sum`` adds
any number of branches to its identity input (the parallel block adds attention and the FFN to
the same x); ``residual`` names the module that combines them (``add``: x + F, ``rezero``,
``deepnorm``: see block.Residual). Norm modules and their stages share a name (``ln1``).

Everything that depends on the wiring reads this table: the config (the allowed ``norm_position``
names and their rules), the parameter count (the norms a block has), the block's module path
(which interprets the steps), the activation cache (decompositions walk the sums back to x0),
diagnostics (identity and branch paths at each connection), the tracer (what each stage is) and
the CLI's help. The lean wirings of block.py are optimisations registered under a layout's name
(``lean``: one exists), checked equal to the module path.

Torch-free: config imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .norm_kinds import NORM_KINDS, NormKind
from .residual_kinds import RESIDUAL_KINDS, ResidualKind

SUBLAYERS = ("attn", "ffn")


@dataclass(frozen=True)
class Norm:
    """A norm module and its stage ``name``, normalising stage ``reads``."""

    name: str
    reads: str


@dataclass(frozen=True)
class Sublayer:
    """Attention or the FFN (``name``) applied to stage ``reads``; its output is stage ``{name}.out``."""

    name: str
    reads: str

    @property
    def out(self) -> str:
        return f"{self.name}.out"


@dataclass(frozen=True)
class Sum:
    """A residual connection: stage ``name`` = combine(stage ``x``, the sum of the ``branches`` stages),
    by the Residual module ``residual``."""

    name: str
    x: str
    branches: tuple[str, ...]
    residual: str


Step = Norm | Sublayer | Sum


@dataclass(frozen=True)
class Connection:
    """One sublayer's residual connection: ``out = combine(x, ... + branch + ...)``; ``branch`` is the
    stage holding the sublayer's contribution as it is added (its output, or the norm of it)."""

    sublayer: str  # "attn" or "ffn"
    x: str  # the identity path's input
    branch: str  # this sublayer's branch, as added
    out: str  # the stage holding the sum
    residual: str  # the Residual module combining them ("res1", "res2")
    others: tuple[str, ...] = ()  # the other branches the same sum adds (the parallel block's)


@dataclass(frozen=True)
class Layout:
    """How a block is wired: ``steps`` in forward order, and what goes around the block."""

    name: str  # the ModelConfig.norm_position value
    summary: str  # one line for --help: where the norms sit
    title: str  # the layout in words, the head of its formula ("pre-norm", "parallel, one norm")
    steps: tuple[Step, ...]
    final_norm: bool  # a stack of these blocks ends with a norm before the head by default
    lean: bool = False  # block.py registers a lean wiring for it (kernels.py), taken where the config allows
    # TransformerLens' names for a norm this block has once: (its name there, this block's norm). Its
    # HookedTransformer gives a block with one norm feeding both branches two tied norms (GPT-J, Phi: ln2 a
    # copy of ln1 feeding the MLP alone): the cache reads the copy's names as the one norm's stages
    transformerlens_copies: tuple[tuple[str, str], ...] = ()
    norm_on_stream: bool = field(init=False)  # a norm's output is the residual stream (post-norm)

    def __post_init__(self) -> None:
        known = {"resid_pre"}
        for step in self.steps:
            inputs = [step.reads] if not isinstance(step, Sum) else [step.x, *step.branches]
            missing = [s for s in inputs if s not in known]
            if missing:
                raise ValueError(
                    f"layout {self.name!r}: step {step.name!r} reads {missing}, not computed before it")
            known |= {step.out} if isinstance(step, Sublayer) else {step.name}
        object.__setattr__(self, "norm_on_stream", bool(set(self.norms) & self._stream_inputs()))

    def _stream_inputs(self) -> set[str]:
        """The stages a residual connection takes as its identity input, and the block's output."""
        return {s.x for s in self.steps if isinstance(s, Sum)} | {self.output}

    @property
    def formula(self) -> str:
        """The block as math with a plain residual sum and LayerNorm, headed by the title
        (``post-norm: y = LN1(x + MHA(x)), z = LN2(y + FFN(y))``); ``block_formula`` for other kinds."""
        return f"{self.title}: {block_formula(self, RESIDUAL_KINDS['add'], NORM_KINDS['standard'])}"

    @property
    def output(self) -> str:
        """The stage holding the block's output: the next block's resid_pre."""
        last = self.steps[-1]
        return last.out if isinstance(last, Sublayer) else last.name

    @property
    def norms(self) -> tuple[str, ...]:
        """The block's norm modules, in forward order (each also a stage)."""
        return tuple(s.name for s in self.steps if isinstance(s, Norm))

    @property
    def norm_inputs(self) -> dict[str, str]:
        """Each norm -> the stage it normalises."""
        return {s.name: s.reads for s in self.steps if isinstance(s, Norm)}

    @property
    def residuals(self) -> tuple[str, ...]:
        """The block's Residual modules, one per sum, in forward order."""
        return tuple(s.residual for s in self.steps if isinstance(s, Sum))

    @property
    def sums(self) -> tuple[Sum, ...]:
        return tuple(s for s in self.steps if isinstance(s, Sum))

    def sublayer(self, name: str) -> Sublayer:
        return next(s for s in self.steps if isinstance(s, Sublayer) and s.name == name)

    @property
    def connections(self) -> dict[str, Connection]:
        """Each sublayer's residual connection, by sublayer ("attn", "ffn"). A sublayer whose output reaches
        no sum itself (the simplified block's attention, which feeds the FFN) has none."""
        found = {}
        for name in SUBLAYERS:
            branch = self._branch_of(name)
            total = next((s for s in self.sums if branch in s.branches), None)
            if total is None:
                continue
            others = tuple(b for b in total.branches if b != branch)
            found[name] = Connection(name, total.x, branch, total.name, total.residual, others)
        return found

    def _branch_of(self, sublayer: str) -> str:
        """The stage through which ``sublayer`` reaches a sum: its output, or a norm reading only that."""
        stage = self.sublayer(sublayer).out
        for step in self.steps:
            if isinstance(step, Norm) and step.reads == stage:
                stage = step.name
        return stage

    def connection_into(self, out: str) -> Connection:
        """The first residual connection whose sum is stage ``out`` (``resid_mid`` or ``resid_post``)."""
        return next(c for c in self.connections.values() if c.out == out)

    def stages(self, inner: dict[str, tuple[str, ...]]) -> list[str]:
        """Every stage of the block in the order a forward pass reaches it, a module's own stages
        (``inner["attn"]``: q, k, ...; ``inner["ln1"]``: scale) expanded as ``attn.q``, ``ln1.scale``, ...
        before the step's own (a sublayer's output is its last inner stage)."""
        order = ["resid_pre"]
        for step in self.steps:
            order += [f"{step.name}.{stage}" for stage in inner.get(step.name, ())]
            if not isinstance(step, Sublayer):
                order.append(step.name)
        return order


LAYOUTS: dict[str, Layout] = {
    layout.name: layout for layout in (
        Layout(
            "post", "post: a norm after each residual add (the original Transformer, BERT)",
            "post-norm",
            (Sublayer("attn", "resid_pre"),
             Sum("resid_mid", "resid_pre", ("attn.out",), "res1"),
             Norm("ln1", "resid_mid"),
             Sublayer("ffn", "ln1"),
             Sum("resid_post", "ln1", ("ffn.out",), "res2"),
             Norm("ln2", "resid_post")),
            final_norm=False, lean=True,
        ),
        Layout(
            "pre", "pre: a norm before each sublayer, the residual stream left alone (GPT-2, Llama)",
            "pre-norm",
            (Norm("ln1", "resid_pre"),
             Sublayer("attn", "ln1"),
             Sum("resid_mid", "resid_pre", ("attn.out",), "res1"),
             Norm("ln2", "resid_mid"),
             Sublayer("ffn", "ln2"),
             Sum("resid_post", "resid_mid", ("ffn.out",), "res2")),
            final_norm=True, lean=True,
        ),
        Layout(
            "sandwich", "sandwich: pre-norm plus a norm on each sublayer's output (CogView, NormFormer)",
            "sandwich",
            (Norm("ln1", "resid_pre"),
             Sublayer("attn", "ln1"),
             Norm("ln1_out", "attn.out"),
             Sum("resid_mid", "resid_pre", ("ln1_out",), "res1"),
             Norm("ln2", "resid_mid"),
             Sublayer("ffn", "ln2"),
             Norm("ln2_out", "ffn.out"),
             Sum("resid_post", "resid_mid", ("ln2_out",), "res2")),
            final_norm=True,
        ),
        Layout(
            "res_post", "res_post: a norm on each sublayer's output before its residual add, none on the "
                        "way in (OLMo 2; Swin v2's res-post-norm)",
            "res-post",
            (Sublayer("attn", "resid_pre"),
             Norm("ln1_out", "attn.out"),
             Sum("resid_mid", "resid_pre", ("ln1_out",), "res1"),
             Sublayer("ffn", "resid_mid"),
             Norm("ln2_out", "ffn.out"),
             Sum("resid_post", "resid_mid", ("ln2_out",), "res2")),
            final_norm=True,
        ),
        Layout(
            "parallel", "parallel: attention and the FFN side by side on one x, each after its own norm "
                        "(GPT-NeoX, Pythia)",
            "parallel",
            (Norm("ln1", "resid_pre"),
             Sublayer("attn", "ln1"),
             Norm("ln2", "resid_pre"),
             Sublayer("ffn", "ln2"),
             Sum("resid_post", "resid_pre", ("attn.out", "ffn.out"), "res1")),
            final_norm=True,
        ),
        Layout(
            "parallel_shared", "parallel_shared: attention and the FFN side by side after one shared norm "
                               "(GPT-J, PaLM)",
            "parallel, one norm",
            (Norm("ln1", "resid_pre"),
             Sublayer("attn", "ln1"),
             Sublayer("ffn", "ln1"),
             Sum("resid_post", "resid_pre", ("attn.out", "ffn.out"), "res1")),
            final_norm=True, transformerlens_copies=(("ln2", "ln1"),),
        ),
        Layout(
            "simplified", "simplified: attention then the FFN, one residual sum around both, then a norm "
                          "(the tutorials' simplified block)",
            "simplified",
            (Sublayer("attn", "resid_pre"),
             Sublayer("ffn", "attn.out"),
             Sum("resid_post", "resid_pre", ("ffn.out",), "res1"),
             Norm("ln1", "resid_post")),
            final_norm=False,
        ),
    )
}


# ---- the block as it is: the layout with its residual kind and norm kind --------------------------

SUBLAYER_SYMBOLS = {"attn": "MHA", "ffn": "FFN"}
STREAM_NAMES = "yuvw"  # the stream stages inside the block, in turn (x enters it, z leaves it)


def block_formula(layout: Layout, residual: ResidualKind, norm: NormKind) -> str:
    """The block as math, from its layout's steps with its residual kind's sum and its norm kind's
    symbol: ``y = LN1(x + MHA(x)), z = LN2(y + FFN(y))`` for post-norm; ``y = MHA(x), z = FFN(y)`` without
    a residual or a norm. Each stream stage (the input of a sum, or the block's output) is named in turn."""
    streams = layout._stream_inputs()  # the stages the stream passes through, the output included
    expr, names, lines = {"resid_pre": "x"}, iter(STREAM_NAMES), []
    for step in layout.steps:
        if isinstance(step, Sublayer):
            expr[step.out] = f"{SUBLAYER_SYMBOLS[step.name]}({expr[step.reads]})"
            continue
        if isinstance(step, Norm):
            symbol = norm.symbol and f"{norm.symbol}{step.name.removeprefix('ln')}"
            value = f"{symbol}({expr[step.reads]})" if symbol else expr[step.reads]
        else:
            value = residual.sum.format(x=expr[step.x], f=" + ".join(expr[b] for b in step.branches))
        if step.name in streams:
            name = "z" if step.name == layout.output else next(names)
            lines.append(f"{name} = {value}")
            value = name
        expr[step.name] = value
    return ", ".join(lines)


def block_title(layout: Layout, residual: ResidualKind, norm: NormKind) -> str:
    """The block in a few words: the layout's title, with the residual kind and the norm kind where they
    are not the layout's plain sum and LayerNorm ("post-norm", "pre-norm, ReZero, RMSNorm", "no norm")."""
    parts = [layout.title if norm.normalises else "no norm", residual.label,
             norm.label if norm.normalises and norm.symbol != "LN" else ""]
    return ", ".join(p for p in parts if p)

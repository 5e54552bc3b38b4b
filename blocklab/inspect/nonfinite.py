"""Non-finite values (NaN, +Inf, -Inf): find the first stage where one appeared.

Every stage of the stack has a hook point (``embed``, ``blocks.{i}.attn.q`` ... ``logits``,
``loss``), and hooks fire in forward order, so the first hook that sees a non-finite value
is the stage where it first appeared. In the backward pass the same hook points watch the
gradient flowing into each stage; the first one to fire is the stage nearest the loss.

    with detect_nonfinite(model):             # raises NonFiniteError at the first bad stage
        logits, loss = model(tokens, targets)
        loss.backward()
    event = find_first_nonfinite(model, tokens, targets)   # or None: localise after the fact
    refuse_nonfinite_output(model, logits, "logits", tokens)  # a result with a NaN/Inf: where it began
    check_parameters(model); check_gradients(model)        # weights and .grad, in module order
    with watch_step(model, True, stop):                    # the trainer's --detect-nonfinite
        ...one optimizer step...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..nn.hooks import hook_points, hooks

# The detector observes (nn/hooks.py): the model computes exactly what it computes unwatched, on the
# path it takes unwatched. Stages the running path does not materialise are computed beside it for
# the observers; attention's (T x T per head) and the vocabulary softmax are the costly ones, so the
# training detector leaves them out unless asked.
COSTLY_TO_OBSERVE = re.compile(r"(^|\.)(scores|weights|probs)$")

# What each axis of a stage's tensor means, by the stage's last name (default: batch, token, feature).
_AXES: dict[str, tuple[str, ...]] = {
    "q": ("batch", "head", "token", "feature"),
    "k": ("batch", "head", "token", "feature"),
    "v": ("batch", "head", "token", "feature"),
    "scores": ("batch", "head", "query", "key"),
    "weights": ("batch", "head", "query", "key"),
    "logits": ("batch", "token", "vocab"),
    "probs": ("batch", "token", "vocab"),
}


class NonFiniteError(ValueError):
    """A NaN or Inf was found; ``event`` says where. Its message is one line."""

    def __init__(self, event: NonFiniteEvent, context: str = "") -> None:
        self.event = event
        super().__init__(f"{event.describe()}{context}")


@dataclass(frozen=True)
class NonFiniteEvent:
    """Where the first non-finite value was: ``kind`` is activation, gradient, parameter or grad."""

    kind: str  # "activation" (forward stage), "gradient" (backward into a stage), "parameter", "grad"
    name: str  # stage name (``blocks.1.ffn.hidden``) or parameter name (``blocks.0.ffn.w1.weight``)
    index: tuple[int, ...]  # index of the first non-finite element
    value: float  # nan, inf or -inf
    shape: tuple[int, ...]
    count: int  # how many elements of the tensor are non-finite

    @property
    def layer(self) -> int | None:
        """The block index the stage belongs to (None for embed, ln_f, logits, loss)."""
        match = re.search(r"(?:^|\.)blocks\.(\d+)\.", self.name)
        return int(match.group(1)) if match else None

    @property
    def axes(self) -> tuple[str, ...]:
        """Names of the axes of ``index``: (batch, token, feature), (batch, head, query, key), ..."""
        if self.kind in ("parameter", "grad"):
            return ("row", "column")[: len(self.index)] if len(self.index) <= 2 else ()
        axes = _AXES.get(self.name.rsplit(".", 1)[-1], ("batch", "token", "feature"))
        return axes if len(axes) == len(self.index) else tuple(f"dim{i}" for i in range(len(self.index)))

    @property
    def position(self) -> int | None:
        """The token (query) position of the first non-finite element, when the stage has one."""
        for axis, i in zip(self.axes, self.index, strict=False):
            if axis in ("token", "query"):
                return i
        return None

    def describe(self) -> str:
        """One line: ``nan in activation blocks.1.ffn.hidden (layer 1, batch 0, token 3, feature 17)``."""
        where = [f"layer {self.layer}"] if self.layer is not None else []
        where += [f"{axis} {i}" for axis, i in zip(self.axes, self.index, strict=False)] or (
            [f"index {self.index}"] if self.index else [])
        what = {"activation": "activation", "gradient": "gradient into stage", "parameter": "parameter",
                "grad": "gradient of parameter"}[self.kind]
        count = f"; {self.count} of {_numel(self.shape)} values non-finite" if self.count > 1 else ""
        return f"{self.value} in {what} {self.name} ({', '.join(where) or 'scalar'}{count})"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def first_nonfinite(x: Tensor, kind: str, name: str) -> NonFiniteEvent | None:
    """The event for the first non-finite element of ``x`` (row-major order), or None."""
    if not (x.is_floating_point() or x.is_complex()):
        return None
    bad = ~torch.isfinite(x.detach())
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0]) if x.dim() else ()
    return NonFiniteEvent(kind, name, index, float(x.detach()[index]), tuple(x.shape), int(bad.sum()))


def check_parameters(model: nn.Module) -> NonFiniteEvent | None:
    """The first parameter (in module order, which is forward order) holding a NaN/Inf."""
    for name, p in model.named_parameters():
        event = first_nonfinite(p, "parameter", name)
        if event:
            return event
    return None


def check_gradients(model: nn.Module) -> NonFiniteEvent | None:
    """The first parameter (module order) whose ``.grad`` holds a NaN/Inf.

    A NaN born in the backward pass spreads to every gradient upstream of it, so this says
    *that* gradients went bad; ``detect_nonfinite`` says *where* (the stage it entered).
    """
    for name, p in model.named_parameters():
        if p.grad is not None:
            event = first_nonfinite(p.grad, "grad", name)
            if event:
                return event
    return None


class NonFiniteDetector:
    """Records the first non-finite activation (forward order) and gradient (backward order)."""

    def __init__(self, raise_at_first: bool = True) -> None:
        self.raise_at_first = raise_at_first
        self.events: list[NonFiniteEvent] = []

    @property
    def first(self) -> NonFiniteEvent | None:
        """The first event seen, or None."""
        return self.events[0] if self.events else None

    def _record(self, event: NonFiniteEvent) -> None:
        self.events.append(event)
        if self.raise_at_first and len(self.events) == 1:
            raise NonFiniteError(event)

    def hook(self, x: Tensor, name: str) -> None:
        """Hook function: check the stage's value, and watch the gradient that will flow into it."""
        if self.events and self.raise_at_first:
            return
        event = first_nonfinite(x, "activation", name)
        if event:
            self._record(event)
        elif x.requires_grad:
            x.register_hook(lambda g: self._on_grad(g, name))

    def _on_grad(self, grad: Tensor, name: str) -> None:
        if not (self.events and self.raise_at_first):
            event = first_nonfinite(grad, "gradient", name)
            if event:
                self._record(event)


@contextmanager
def detect_nonfinite(
    model: nn.Module, raise_at_first: bool = True, include_costly: bool = False
) -> Iterator[NonFiniteDetector]:
    """Watch every stage of ``model`` for NaN/Inf in the forward and backward pass.

    With ``raise_at_first`` the first non-finite stage raises ``NonFiniteError`` (the forward
    or backward stops there); otherwise events are collected in ``detector.events``.
    ``include_costly`` also watches attention scores/weights and probs (computed for the detector).
    The detector only observes: the model's numbers are the same, watched or not.
    """
    detector = NonFiniteDetector(raise_at_first)
    names = [n for n in hook_points(model) if include_costly or not COSTLY_TO_OBSERVE.search(n)]
    with hooks(model, {name: detector.hook for name in names}, observe=True):
        yield detector


def find_first_nonfinite(
    model: nn.Module, *args: object, backward: bool = True, **kwargs: object
) -> NonFiniteEvent | None:
    """Run ``model(*args, **kwargs)`` (and backward of its loss) and return the first NaN/Inf.

    Checks, in order: the parameters, each forward stage (attention internals included),
    then the gradients flowing back into each stage. Parameter gradients are not touched.
    """
    event = check_parameters(model)
    if event:
        return event
    with detect_nonfinite(model, raise_at_first=False, include_costly=True) as detector:
        out = model(*args, **kwargs)
        loss = out[1] if isinstance(out, tuple) else None
        if backward and loss is not None and loss.requires_grad and not detector.events:
            params = [p for p in model.parameters() if p.requires_grad]
            torch.autograd.grad(loss, params, allow_unused=True)  # fires the stage gradient hooks
    return detector.first


def refuse_nonfinite_output(model: nn.Module, output: Tensor, what: str, *args: object,
                            **kwargs: object) -> None:
    """NonFiniteError when ``output`` (``what``: the logits, embeddings or probabilities that
    ``model(*args, **kwargs)`` led to) holds a NaN or Inf, naming the first stage of that forward where one
    appeared: finite weights can still overflow float32 (3e38 in an FFN matrix). The forward runs again,
    watched, only then."""
    if bool(torch.isfinite(output).all()):
        return
    event = check_parameters(model)
    if event is None:  # (attention's scores are left out: a mask's -inf there is by design)
        with torch.no_grad(), detect_nonfinite(model, raise_at_first=False) as detector:
            model(*args, **kwargs)
        event = detector.first
    raise NonFiniteError(event or first_nonfinite(output, "activation", what),
                         f"; the {what} are not finite, so there is no result to give")


@contextmanager
def watch_step(
    model: nn.Module, enabled: bool, stop: Callable[[NonFiniteError], BaseException]
) -> Iterator[None]:
    """One training step under ``--detect-nonfinite``: the first NaN/Inf in its forward or backward
    pass, or in the weights after the update, ends it. The RNG state goes back to where the step
    began and ``stop(error)`` is raised instead (a NaN found before the update leaves the weights
    those of the last complete step).
    """
    if not enabled:
        yield
        return
    rng = torch.get_rng_state()
    try:
        with detect_nonfinite(model):
            yield
        bad = check_parameters(model)
        if bad:
            raise NonFiniteError(bad, " (after the optimizer update)")
    except NonFiniteError as error:
        torch.set_rng_state(rng)
        raise stop(error) from None

"""How the blocks' linear weights start: the named init schemes (``ModelConfig.init``).

Each scheme draws one weight matrix (PyTorch's layout, ``(out_features, in_features)``) in place.
``model.init_weights`` applies the config's scheme to every linear layer of the blocks (attention's
q, k, v, o and the feed-forward's w1, w2, w3); the embeddings, the LM head (``torch``'s draw), biases
(0) and norms (gamma 1, beta 0) start the same way in every scheme. Each scheme draws one normal
sample per entry, so a model's other tables draw the same numbers whichever scheme its blocks use.

    torch     N(0, 1 / (3 fan_in))                  PyTorch's nn.Linear (its kaiming-uniform draws
                                                    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), this variance);
                                                    blocklab's default
    default   N(0, 0.02^2)                          GPT-2's (Radford et al. 2019) and BERT's; blocklab's
                                                    default before issue 30, still its GPT and BERT presets'
    xavier    N(0, 2 / (fan_in + fan_out))          Glorot and Bengio 2010 (normal form); Vaswani et
                                                    al.'s tensor2tensor and Xiong et al. 2020's theorem
    he        N(0, 2 / fan_in)                      He et al. 2015, for ReLU layers
    lecun     N(0, 1 / fan_in)                      LeCun et al. 1998; T5's (Mesh TensorFlow) default

At d_model 64, ``default``'s std 0.02 is about 6x below Xavier's 0.125 for a square matrix, so
every block starts near the identity; the others keep a layer's output variance near its input's.
0.02 is ``torch``'s std at 768 inputs, GPT-2's width, where the two agree; at d_model 64 it is 3.6 times
below it, and the default model needed clearly more steps than a plain PyTorch loop to its target
(issue 30; docs/training.md shows the record): the default is ``torch``, whose std follows each
layer's width. (The name ``default`` stays GPT-2's scheme: checkpoints saved before ``init`` existed
were built with it, ``config.SAVED_BEFORE``.)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

DEFAULT_STD = 0.02  # GPT-2's linear weights


def _default(weight: Tensor) -> None:
    nn.init.normal_(weight, mean=0.0, std=DEFAULT_STD)


def _xavier(weight: Tensor) -> None:
    nn.init.xavier_normal_(weight)


def _he(weight: Tensor) -> None:
    nn.init.kaiming_normal_(weight, mode="fan_in", nonlinearity="relu")


def _lecun(weight: Tensor) -> None:
    nn.init.normal_(weight, mean=0.0, std=weight.shape[1] ** -0.5)


def _torch(weight: Tensor) -> None:
    nn.init.normal_(weight, mean=0.0, std=(3 * weight.shape[1]) ** -0.5)


# name -> how one block weight matrix is drawn (the module docstring's table)
INIT_SCHEMES: dict[str, Callable[[Tensor], None]] = {
    "default": _default,
    "xavier": _xavier,
    "he": _he,
    "lecun": _lecun,
    "torch": _torch,
}

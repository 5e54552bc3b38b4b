"""Variants as records (nn/norm_kinds.py, nn/activation_kinds.py, nn/ffn_kinds.py, nn/position_kinds.py): a
norm kind, an activation, an FFN kind or a position kind is one entry of its table, and everything else
follows (each position kind checked against what its record says).

Shown three ways: Gemma's RMSNorm (gamma = 1 + w), a shipped entry, against transformers' GemmaRMSNorm and a
float64 hand forward, in a model that is counted, hooked, traced, folded and trained; test-only records
(a norm, two activations and an FFN kind the package does not have), added to the tables alone, through
the module, gradcheck in float64, the parameter count, the tracer's sentence and run_with_cache; and a scan
of the library: no file but the records compares a variant's name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck
from torch.func import functional_call

import blocklab as bl
from blocklab.inspect.trace.collect import collect_trace
from blocklab.nn.activations import ACTIVATION_KINDS, ActivationKind
from blocklab.nn.cache import run_with_cache
from blocklab.nn.feedforward import FeedForward
from blocklab.nn.ffn_kinds import FFN_KINDS, FFNKind
from blocklab.nn.norm_kinds import NORM_KINDS, NormKind
from blocklab.nn.norms import LayerNorm
from blocklab.nn.params import count_parameters
from blocklab.nn.position_kinds import POSITION_KINDS

f64 = torch.float64
SMALL = dict(vocab_size=11, max_seq_len=6, d_model=8, n_heads=2, n_layers=2, d_ff=12, norm_position="pre",
             causal=True)
IDS = [1, 4, 2, 7, 3]


def hand_norm(z: torch.Tensor, eps: float, centres: bool, inside: bool, gamma: torch.Tensor | None,
              beta: torch.Tensor | None) -> torch.Tensor:
    """A per-position norm in float64 from its definition (docs/concepts.md#layer-normalization)."""
    centred = z - z.mean(-1, keepdim=True) if centres else z
    second = (centred * centred).mean(-1, keepdim=True)
    out = centred / (torch.sqrt(second + eps) if inside else torch.sqrt(second) + eps)
    out = out * gamma if gamma is not None else out
    return out + beta if beta is not None else out


def perturbed(model: bl.Transformer) -> bl.Transformer:
    """Every 1-D parameter (norm weights, biases) moved off its init, so that it matters."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


# ---- Gemma's RMSNorm: one entry of NORM_KINDS -------------------------------------------------------


def test_gemma_rms_norm_matches_transformers_and_a_float64_hand_forward() -> None:
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    torch.manual_seed(0)
    ours, theirs = LayerNorm(16, 1e-6, "rms_plus_one").double(), GemmaRMSNorm(16, eps=1e-6).double()
    assert torch.equal(ours.weight, theirs.weight) and ours.bias is None  # both start at w = 0: gamma 1
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16, dtype=f64))
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 16, dtype=f64)
    # transformers computes in float32 whatever the input (x.float()): agreement to float32's rounding
    torch.testing.assert_close(ours(x), theirs(x), rtol=2e-6, atol=2e-6)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * (1 + ours.weight.detach())
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-13)
    assert ours.state_dict().keys() == theirs.state_dict().keys() == {"weight"}


@pytest.mark.parametrize("fused", [True, False])
def test_a_gemma_norm_model_is_counted_hooked_traced_folded_and_trained(fused: bool) -> None:
    config = bl.ModelConfig(**SMALL, norm="rms_plus_one", bias=False, fused=fused, eps=1e-6)
    torch.manual_seed(0)
    model = perturbed(bl.Transformer(config)).double().eval()
    # counted: d per norm (gamma only), as the modules hold
    assert count_parameters(config).total == sum(p.numel() for p in model.parameters())
    assert count_parameters(config).per_layer["ln1"] == 8
    # hooked: ln1 and its scale against the hand forward of the cached input
    tokens = torch.tensor([IDS])
    _, cache = run_with_cache(model, tokens)
    x = cache["blocks.1.resid_pre"]
    w = model.blocks[1].ln1.weight.detach()
    torch.testing.assert_close(cache["blocks.1.ln1"], hand_norm(x, 1e-6, False, True, 1 + w, None),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(cache["blocks.1.ln1.scale"], torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6),
                               rtol=0, atol=1e-12)
    # traced: its label, its numbers (no centring: mu 0, ms = mean(z^2)) and its sentence
    trace = collect_trace(model, IDS)
    stage = trace.stage("blocks.1.ln1")
    assert stage.norm_module == "RMSNorm (1 + w)" and float(stage.norm.mu.abs().max()) == 0.0
    torch.testing.assert_close(stage.norm.var, (x[0] * x[0]).mean(-1), rtol=0, atol=1e-12)
    assert stage.explanation.startswith("RMSNorm (1 + w): divided each position by sqrt(mean(z^2) + eps)")
    assert "then (1 + w) * z_hat" in stage.explanation
    # folded: fold_ln moves 1 + w into the linears (the weight left at 0) and the logits stay
    before = model(tokens)
    model.fold_ln()
    torch.testing.assert_close(model(tokens), before, rtol=0, atol=1e-10)
    assert float(model.blocks[0].ln1.weight.detach().abs().max()) == 0.0
    # trained: the norm weights get gradients and a few steps lower the loss on a fixed batch
    trains(config, lambda model: float(model.blocks[0].ln2.weight.grad.abs().max()) > 0)


def trains(config: bl.ModelConfig, check=lambda model: True) -> None:
    """15 AdamW steps on a fixed batch lower the loss by 30%; ``check(model)`` holds after each backward."""
    torch.manual_seed(0)
    model = bl.Transformer(config).train()
    batch = torch.randint(0, 11, (8, 6))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        assert check(model)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


# ---- OLMo's LayerNorm without parameters: one entry of NORM_KINDS ----------------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_a_nonparametric_norm_matches_olmo_and_its_model_is_counted_hooked_traced_folded_and_trained(
        fused: bool) -> None:
    """``nonparametric`` (no gamma, no beta) equals transformers' OlmoLayerNorm (which computes in float32)
    and a float64 hand LayerNorm; a model of it has no norm parameters, its ln1 stage is the hand norm, the
    tracer names it, fold_ln leaves the logits, and it trains."""
    from transformers.models.olmo.modeling_olmo import OlmoLayerNorm

    ours = LayerNorm(16, 1e-5, "nonparametric").double()
    assert ours.weight is None and ours.bias is None and not ours.state_dict()
    x = 3 * torch.randn(3, 5, 16, dtype=f64)
    torch.testing.assert_close(ours(x), hand_norm(x, 1e-5, True, True, None, None), rtol=0, atol=1e-13)
    torch.testing.assert_close(ours(x), OlmoLayerNorm(16)(x), rtol=0, atol=2e-6)  # float32 there
    config = bl.ModelConfig(**SMALL, norm="nonparametric", bias=False, fused=fused, eps=1e-5)
    torch.manual_seed(0)
    model = perturbed(bl.Transformer(config)).double().eval()
    assert count_parameters(config).total == sum(p.numel() for p in model.parameters())
    assert count_parameters(config).per_layer.get("ln1", 0) == 0
    tokens = torch.tensor([IDS])
    _, cache = run_with_cache(model, tokens)
    torch.testing.assert_close(cache["blocks.1.ln1"], hand_norm(cache["blocks.1.resid_pre"], 1e-5, True, True,
                                                                 None, None), rtol=0, atol=1e-12)
    stage = collect_trace(model, IDS).stage("blocks.1.ln1")
    assert stage.norm_module == "LayerNorm (no parameters)" and "no gamma, no beta" in stage.explanation
    before = model(tokens)
    model.fold_ln()
    torch.testing.assert_close(model(tokens), before, rtol=0, atol=1e-10)
    trains(config)


# ---- test-only records: a norm and activations the package does not have ----------------------------

TEST_NORM = NormKind(
    "test_uncentred_outside", "TestNorm", "TN",
    "z / (sqrt(mean(z^2)) + eps) = {span}, eps = {eps}; then (0.5 + w)",
    centres=False, eps_inside_root=False, scale_offset=0.5, bias=True,
)


@pytest.fixture
def test_norm(monkeypatch: pytest.MonkeyPatch) -> NormKind:
    monkeypatch.setitem(NORM_KINDS, TEST_NORM.name, TEST_NORM)
    return TEST_NORM


@pytest.mark.parametrize("fused", [True, False])
def test_a_norm_added_as_a_record_alone_works_everywhere(test_norm: NormKind, fused: bool) -> None:
    torch.manual_seed(0)
    norm = LayerNorm(6, 0.05, test_norm.name, fused=fused).double()
    with torch.no_grad():
        norm.weight.add_(torch.randn(6, dtype=f64))
        norm.bias.add_(torch.randn(6, dtype=f64))
    x = torch.randn(2, 3, 6, dtype=f64, requires_grad=True)
    gamma, beta = 0.5 + norm.weight.detach(), norm.bias.detach()
    torch.testing.assert_close(norm(x), hand_norm(x, 0.05, False, False, gamma, beta), rtol=0, atol=1e-13)
    params = (norm.weight.detach().clone().requires_grad_(), norm.bias.detach().clone().requires_grad_())
    assert gradcheck(lambda x, w, b: functional_call(norm, {"weight": w, "bias": b}, (x,)), (x, *params))
    # in a model: counted, cached, traced
    config = bl.ModelConfig(**SMALL, norm=test_norm.name, fused=fused, eps=0.05)
    assert count_parameters(config).per_layer["ln1"] == 16  # gamma and beta
    torch.manual_seed(0)
    model = perturbed(bl.Transformer(config)).double().eval()
    assert count_parameters(config).total == sum(p.numel() for p in model.parameters())
    _, cache = run_with_cache(model, torch.tensor([IDS]))
    ln = model.blocks[0].ln2
    gamma, beta = 0.5 + ln.weight.detach(), ln.bias.detach()
    expected = hand_norm(cache["blocks.0.resid_mid"], 0.05, False, False, gamma, beta)
    torch.testing.assert_close(cache["blocks.0.ln2"], expected, rtol=0, atol=1e-12)
    stage = collect_trace(model, IDS).stage("blocks.0.ln2")
    assert stage.norm_module == "TestNorm"
    assert stage.explanation.startswith("TestNorm: z / (sqrt(mean(z^2)) + eps) =")
    assert stage.explanation.endswith("eps = 0.05; then (0.5 + w)")


def _softplus_backward(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return g.mul_(torch.sigmoid(h))  # d/dh log(1 + e^h) = sigmoid(h)


TEST_ACTIVATIONS = [
    ActivationKind("test_softplus", "Softplus", "softplus log(1 + e^h) smoothed the kink of ReLU", F.softplus,
                   _softplus_backward),
    ActivationKind("test_softplus_glu", "SoftplusGLU", "softplus(W1 x) * (W3 x), a test gate", F.softplus,
                   _softplus_backward, ffn="gated"),
]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind", TEST_ACTIVATIONS, ids=lambda k: k.name)
def test_an_activation_added_as_a_record_alone_works_everywhere(monkeypatch: pytest.MonkeyPatch,
                                                               kind: ActivationKind, fused: bool) -> None:
    monkeypatch.setitem(ACTIVATION_KINDS, kind.name, kind)
    torch.manual_seed(0)
    ffn = FeedForward(5, 7, kind.name, fused=fused).double()
    x = torch.randn(2, 3, 5, dtype=f64, requires_grad=True)
    W = {k: v.detach() for k, v in ffn.state_dict().items()}
    h1 = x @ W["w1.weight"].T + W["w1.bias"]
    act = torch.log1p(torch.exp(h1))  # softplus by hand
    if kind.gated:
        act = act * (x @ W["w3.weight"].T + W["w3.bias"])
    torch.testing.assert_close(ffn(x), act @ W["w2.weight"].T + W["w2.bias"], rtol=0, atol=1e-12)
    weights = {k: v.detach().clone().requires_grad_() for k, v in ffn.named_parameters()}
    assert gradcheck(lambda x, *ws: functional_call(ffn, dict(zip(weights, ws, strict=True)), (x,)),
                     (x, *weights.values()))
    params = 5 * 7 * (2 + kind.gated) + 7 * (1 + kind.gated) + 5  # the matrices and biases by hand
    assert sum(p.numel() for p in ffn.parameters()) == params
    config = bl.ModelConfig(**SMALL, activation=kind.name, fused=fused)
    assert count_parameters(config).per_layer["ffn"] == 8 * 12 * (2 + kind.gated) + 12 * (1 + kind.gated) + 8
    torch.manual_seed(0)
    model = perturbed(bl.Transformer(config)).double().eval()
    _, cache = run_with_cache(model, torch.tensor([IDS]))
    hidden = cache["blocks.1.ffn.hidden"]
    expected = torch.log1p(torch.exp(hidden)) * (cache["blocks.1.ffn.linear"] if kind.gated else 1)
    torch.testing.assert_close(cache["blocks.1.ffn.act"], expected, rtol=0, atol=1e-12)
    stage = collect_trace(model, IDS).stage("blocks.1.ffn.act")
    assert stage.explanation.startswith(kind.explains + ";")


TEST_FFN = FFNKind("test_glu", "test GLU", "(x W1^T + b1) * (x W3^T + b3) W2^T + b2", ("w1", "w3"),
                   ("hidden", "linear", "act", "out"), operands="gated",
                   hidden_words=" (a test's words: the bilinear left factor)")
# Shazeer's bilinear GLU (identity gate, GLU Variants Improve Transformer, 2020) in the test-only FFN kind
TEST_BILINEAR = ActivationKind("test_bilinear", "Bilinear", "bilinear (W1 x) * (W3 x), no nonlinearity",
                               lambda h: h, lambda g, h: g, ffn="test_glu")


@pytest.mark.parametrize("fused", [True, False])
def test_an_ffn_kind_added_as_a_record_alone_works_everywhere(monkeypatch: pytest.MonkeyPatch,
                                                              fused: bool) -> None:
    """A test-only FFN kind (the gated form under its own name and words) and an activation running in
    it: the module builds its matrices and stages, the counts and the tracer read the kind's record."""
    monkeypatch.setitem(FFN_KINDS, TEST_FFN.name, TEST_FFN)
    monkeypatch.setitem(ACTIVATION_KINDS, TEST_BILINEAR.name, TEST_BILINEAR)
    torch.manual_seed(0)
    ffn = FeedForward(5, 7, TEST_BILINEAR.name, fused=fused).double()
    assert ffn.stages == ("hidden", "linear", "act", "out")
    x = torch.randn(2, 3, 5, dtype=f64, requires_grad=True)
    W = {k: v.detach() for k, v in ffn.state_dict().items()}
    bilinear = (x @ W["w1.weight"].T + W["w1.bias"]) * (x @ W["w3.weight"].T + W["w3.bias"])
    torch.testing.assert_close(ffn(x), bilinear @ W["w2.weight"].T + W["w2.bias"], rtol=0, atol=1e-12)
    weights = {k: v.detach().clone().requires_grad_() for k, v in ffn.named_parameters()}
    assert gradcheck(lambda x, *ws: functional_call(ffn, dict(zip(weights, ws, strict=True)), (x,)),
                     (x, *weights.values()))
    config = bl.ModelConfig(**SMALL, activation=TEST_BILINEAR.name, fused=fused)
    assert count_parameters(config).per_layer["ffn"] == 3 * 8 * 12 + 2 * 12 + 8  # w1, w3, w2 and biases
    torch.manual_seed(0)
    model = perturbed(bl.Transformer(config)).double().eval()
    assert count_parameters(config).total == sum(p.numel() for p in model.parameters())
    _, cache = run_with_cache(model, torch.tensor([IDS]))
    hidden, linear = cache["blocks.0.ffn.hidden"], cache["blocks.0.ffn.linear"]
    torch.testing.assert_close(cache["blocks.0.ffn.act"], hidden * linear, rtol=0, atol=0)
    trace = collect_trace(model, IDS)
    assert "with W1 (x W1^T + b1) (a test's words: the bilinear left factor);" in \
        trace.stage("blocks.0.ffn.hidden").explanation
    assert trace.stage("blocks.0.ffn.act").explanation.startswith(TEST_BILINEAR.explains + ";")


# ---- no library file but the records compares a variant's name --------------------------------------

PACKAGE = Path(bl.__file__).parent
RECORDS = {"nn/norm_kinds.py", "nn/activation_kinds.py", "nn/ffn_kinds.py", "nn/position_kinds.py"}
# what chooses variants by value rather than testing one: the claims' arms (tables keyed by the variants
# they compare) and the Hugging Face maps from their names to ours
SETTERS = ("lab/claims/", "weights/hf_")
FIELDS = {"norm", "activation", "variant", "ffn", "pos_encoding"}


def _names_tested(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every variant name compared with a norm/activation/variant value or keying a table."""
    names = set(NORM_KINDS) | set(ACTIVATION_KINDS) | set(FFN_KINDS) | set(POSITION_KINDS)
    found = []

    def mentions_field(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr in FIELDS
                   or isinstance(n, ast.Name) and n.id in FIELDS for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and mentions_field(node):
            for n in ast.walk(node):
                if isinstance(n, ast.Constant) and n.value in names:
                    found.append((node.lineno, n.value))
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
            if len(keys) >= 2:
                found += [(node.lineno, k) for k in keys]
    return found


def test_no_library_file_but_the_records_tests_a_variant_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in RECORDS or rel.startswith(SETTERS):
            continue
        found += [f"{rel}:{line}: {name!r}" for line, name in _names_tested(ast.parse(path.read_text()))]
    assert not found, "\n".join(found)


def test_the_scan_finds_a_planted_name_test() -> None:
    planted = ('def f(c):\n    return 2 if c.norm != "rms" else 1\nT = {"relu": 1, "gelu": 2}\n'
               'g = kind.ffn == "gated"\nr = c.pos_encoding == "rotary"\n')
    assert sorted(_names_tested(ast.parse(planted))) == [(2, "rms"), (3, "gelu"), (3, "relu"), (4, "gated"),
                                                         (5, "rotary")]


@pytest.mark.parametrize("name", list(POSITION_KINDS))
def test_each_position_kind_is_what_its_record_says(name: str) -> None:
    """nn/position_kinds.py: a kind that adds to x0 has a ``pos`` stage of x0 - E[t] (learned: a counted
    table of parameters); rotary rotates q and k (rot_q); ALiBi biases the scores; TransformerLens' view
    names the kind or refuses it."""
    kind = POSITION_KINDS[name]
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("tiny-lm", norm_position="pre", pos_encoding=name)).eval()
    tokens = torch.tensor([[1, 3, 4]])
    _, cache = model.run_with_cache(tokens)
    assert ("pos" in cache) is kind.adds_to_x0
    if kind.learned:  # row p of the table
        torch.testing.assert_close(cache["pos"][0], model.pos.weight[:3])
    elif kind.adds_to_x0:  # sin(p / 10000^(2i/d)), cos(...) by hand
        d, p = model.config.d_model, torch.arange(3, dtype=torch.float64)[:, None]
        angle = p / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        pe = torch.stack([angle.sin(), angle.cos()], -1).flatten(1)
        torch.testing.assert_close(cache["pos"][0].double(), pe, rtol=1e-6, atol=1e-6)
    learned = [n for n, _ in model.named_parameters() if n.startswith("pos.")]
    assert bool(learned) is kind.learned
    assert ("pos" in count_parameters(model.config).components) is kind.learned
    assert ("blocks.0.attn.rot_q" in cache) is kind.rotary
    assert (model.blocks[0].attn.alibi is not None) is kind.alibi
    if kind.transformerlens is None:
        with pytest.raises(ValueError, match="positional_embedding_type"):
            getattr(model.cfg, "positional_embedding_type")  # noqa: B009 (the refusal is what is tested)
    else:
        assert model.cfg.positional_embedding_type == kind.transformerlens

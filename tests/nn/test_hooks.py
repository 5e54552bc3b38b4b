"""Tests for blocklab.nn.hooks: the activation cache against a float64 recomputation written by hand
from the weights, hooks that replace values (ablations), name filters and errors.

The oracle below re-derives every stage of docs/concepts.md with plain torch ops in float64:
it shares no code with blocklab beyond reading the weights by their state-dict keys.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

import blocklab as bl
from blocklab.nn.cache import run_with_cache
from blocklab.nn.hooks import hook_points

# ---- the oracle ---------------------------------------------------------------------------------

ACTIVATIONS = {
    "relu": lambda h: h.clamp(min=0),
    "gelu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "gelu_tanh": lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
    "gelu_sigmoid": lambda h: h / (1 + torch.exp(-1.702 * h)),
    "relu2": lambda h: h.clamp(min=0) ** 2,
    "swiglu": lambda h: h / (1 + torch.exp(-h)),
    "geglu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "geglu_tanh": lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
}
GATED = ("swiglu", "geglu", "geglu_tanh")


def oracle(model: bl.Transformer, tokens: Tensor, targets: Tensor | None = None,
           ablate: tuple[str, ...] = (), graph: bool = False) -> dict[str, Tensor]:
    """Every stage, recomputed in float64 from the weights. ``ablate``: sublayers ('blocks.0.attn',
    'blocks.1.ffn') whose output is replaced by zeros. ``graph``: the weights require gradients, so
    every stage is in an autograd graph (tests/nn/test_cache.py differentiates the loss by them)."""
    c = model.config
    W = {k: v.detach().to(torch.float64).requires_grad_(graph) for k, v in model.state_dict().items()}
    S: dict[str, Tensor] = {}
    B, T = tokens.shape
    d, h = c.d_model, c.n_heads
    dk = c.d_head  # d / h unless head_dim says otherwise

    def norm(z: Tensor, key: str) -> Tensor:
        if c.norm == "none":
            return z
        if c.norm == "rms":
            denom = torch.sqrt((z * z).mean(-1, keepdim=True) + c.eps)  # (B, T, 1)
            z_hat = z / denom
        else:
            mu = z.mean(-1, keepdim=True)
            var = ((z - mu) ** 2).mean(-1, keepdim=True)
            denom = var.sqrt() + c.eps if c.norm == "eps_outside_sqrt" else torch.sqrt(var + c.eps)
            z_hat = (z - mu) / denom
        S[f"{key}.scale"] = denom  # TransformerLens' hook_scale: the denominator, before the norm's output
        S[f"{key}.normalized"] = z_hat  # TransformerLens' hook_normalized: before gamma and beta
        out = z_hat * W[f"{key}.weight"]
        return out + W[f"{key}.bias"] if f"{key}.bias" in W else out

    def linear(x: Tensor, key: str) -> Tensor:
        y = x @ W[f"{key}.weight"].T
        return y + W[f"{key}.bias"] if f"{key}.bias" in W else y

    def rotate(x: Tensor) -> Tensor:  # (B, heads, T, dk): pairs of the first r features, by position
        r = int(dk * c.rotary_fraction)
        # cos and sin as transformers computes them: float32 frequencies, angles, cos and sin (then float64)
        inv = 1.0 / (c.rotary_base ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
        angle = torch.arange(T, dtype=torch.float32)[:, None] * inv  # (T, r/2)
        out = x.clone()
        for m in range(r // 2):
            a, b = (m, m + r // 2) if c.rotary_style == "half" else (2 * m, 2 * m + 1)
            cos, sin = angle[:, m].cos().double(), angle[:, m].sin().double()
            out[..., a] = x[..., a] * cos - x[..., b] * sin
            out[..., b] = x[..., b] * cos + x[..., a] * sin
        return out

    def attention(x: Tensor, p: str) -> Tensor:
        q = linear(x, f"{p}.q").view(B, T, h, dk).transpose(1, 2)
        k, v = (linear(x, f"{p}.{n}").view(B, T, -1, dk).transpose(1, 2) for n in "kv")  # (B, h_kv, T, dk)
        S[f"{p}.q"], S[f"{p}.k"], S[f"{p}.v"] = q, k, v
        if c.qk_norm == "head":  # each head's d_k features, one gamma for all heads (Qwen3)
            q = S[f"{p}.q_norm"] = norm(q, f"{p}.q_norm")
            k = S[f"{p}.k_norm"] = norm(k, f"{p}.k_norm")
        elif c.qk_norm == "all_heads":  # all heads' features at once (OLMo 2)
            whole = lambda y: y.transpose(1, 2).reshape(B, T, -1)
            heads = lambda y: y.view(B, T, -1, dk).transpose(1, 2)
            q = S[f"{p}.q_norm"] = heads(norm(whole(q), f"{p}.q_norm"))
            k = S[f"{p}.k_norm"] = heads(norm(whole(k), f"{p}.k_norm"))
        if c.pos_encoding == "rotary":
            q = S[f"{p}.rot_q"] = rotate(q)
            k = S[f"{p}.rot_k"] = rotate(k)
        group = h // k.shape[1]  # query head i reads key/value head i // group
        k, v = (torch.stack([y[:, i // group] for i in range(h)], 1) for y in (k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dk)
        if c.causal:
            scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        if c.sliding_window is not None:  # query i sees keys i - w + 1 .. i
            scores = scores.masked_fill(torch.ones(T, T).tril(-c.sliding_window).bool(), float("-inf"))
        S[f"{p}.scores"] = scores
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        weights = weights / weights.sum(-1, keepdim=True)
        S[f"{p}.weights"] = weights
        z = S[f"{p}.z"] = (weights @ v).transpose(1, 2)  # (B, T, h, dk)
        wo = W[f"{p}.o.weight"]  # head i's result: z_i times columns i*dk..(i+1)*dk of Wo
        result = S[f"{p}.result"] = torch.stack([z[:, :, i] @ wo[:, i * dk:(i + 1) * dk].T for i in range(h)],
                                                2)
        out = result.sum(2)  # = linear(concat z, o) without bo
        out = out + W[f"{p}.o.bias"] if f"{p}.o.bias" in W else out
        out = torch.zeros_like(out) if p in ablate else out
        S[f"{p}.out"] = out
        return out

    def ffn(x: Tensor, p: str) -> Tensor:
        hidden = linear(x, f"{p}.w1")
        S[f"{p}.hidden"] = hidden
        act = ACTIVATIONS[c.activation](hidden)
        if c.activation in GATED:
            S[f"{p}.linear"] = linear(x, f"{p}.w3")
            act = act * S[f"{p}.linear"]
        S[f"{p}.act"] = act
        out = linear(act, f"{p}.w2")
        out = torch.zeros_like(out) if p in ablate else out
        S[f"{p}.out"] = out
        return out

    alpha = (2 * c.n_layers) ** 0.25

    def residual(x: Tensor, f: Tensor, p: str, i: int) -> Tensor:
        if c.residual == "rezero":
            return x + W[f"{p}.res{i}.scale"] * f
        return {"add": x + f, "deepnorm": alpha * x + f, "none": f}[c.residual]

    pos = torch.arange(T, dtype=torch.float64)[:, None]
    pe = torch.zeros(T, d, dtype=torch.float64)
    for j in range(0, d, 2):  # PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)
        pe[:, j] = torch.sin(pos[:, 0] / 10000 ** (j / d))
        if j + 1 < d:
            pe[:, j + 1] = torch.cos(pos[:, 0] / 10000 ** (j / d))
    factor = {"sqrt_d_model": math.sqrt(d), "none": 1.0}[c.embed_scale]  # Vaswani et al. 3.4
    S["tok"] = factor * W["embed.weight"][tokens]
    if c.pos_encoding not in ("none", "rotary"):
        S["pos"] = {"sinusoidal": pe, "learned": W.get("pos.weight", pe)[:T]}[c.pos_encoding].expand(B, T, d)
    x = S["tok"] + S["pos"] if "pos" in S else S["tok"]
    S["embed"] = x
    for i in range(c.n_layers):
        p = f"blocks.{i}"
        S[f"{p}.resid_pre"] = x
        if c.norm_position == "post":
            m = residual(x, attention(x, f"{p}.attn"), p, 1)
            S[f"{p}.resid_mid"] = m
            y = S[f"{p}.ln1"] = norm(m, f"{p}.ln1")
            r = S[f"{p}.resid_post"] = residual(y, ffn(y, f"{p}.ffn"), p, 2)
            x = S[f"{p}.ln2"] = norm(r, f"{p}.ln2")
        elif c.norm_position == "pre":
            y = S[f"{p}.ln1"] = norm(x, f"{p}.ln1")
            m = S[f"{p}.resid_mid"] = residual(x, attention(y, f"{p}.attn"), p, 1)
            y = S[f"{p}.ln2"] = norm(m, f"{p}.ln2")
            x = S[f"{p}.resid_post"] = residual(m, ffn(y, f"{p}.ffn"), p, 2)
        elif c.norm_position == "parallel":  # GPT-NeoX: x + MHA(LN1(x)) + FFN(LN2(x))
            y = S[f"{p}.ln1"] = norm(x, f"{p}.ln1")
            a = attention(y, f"{p}.attn")
            y = S[f"{p}.ln2"] = norm(x, f"{p}.ln2")
            x = S[f"{p}.resid_post"] = residual(x, a + ffn(y, f"{p}.ffn"), p, 1)
        elif c.norm_position == "parallel_shared":  # GPT-J, PaLM: x + MHA(LN1(x)) + FFN(LN1(x))
            y = S[f"{p}.ln1"] = norm(x, f"{p}.ln1")
            a = attention(y, f"{p}.attn")
            x = S[f"{p}.resid_post"] = residual(x, a + ffn(y, f"{p}.ffn"), p, 1)
        elif c.norm_position == "res_post":  # OLMo 2: x + LN1_out(MHA(x)), then y + LN2_out(FFN(y))
            a = S[f"{p}.ln1_out"] = norm(attention(x, f"{p}.attn"), f"{p}.ln1_out")
            m = S[f"{p}.resid_mid"] = residual(x, a, p, 1)
            f = S[f"{p}.ln2_out"] = norm(ffn(m, f"{p}.ffn"), f"{p}.ln2_out")
            x = S[f"{p}.resid_post"] = residual(m, f, p, 2)
        elif c.norm_position == "simplified":  # the tutorials' simplified block: LN1(x + FFN(MHA(x)))
            r = S[f"{p}.resid_post"] = residual(x, ffn(attention(x, f"{p}.attn"), f"{p}.ffn"), p, 1)
            x = S[f"{p}.ln1"] = norm(r, f"{p}.ln1")
        else:  # sandwich
            y = S[f"{p}.ln1"] = norm(x, f"{p}.ln1")
            a = S[f"{p}.ln1_out"] = norm(attention(y, f"{p}.attn"), f"{p}.ln1_out")
            m = S[f"{p}.resid_mid"] = residual(x, a, p, 1)
            y = S[f"{p}.ln2"] = norm(m, f"{p}.ln2")
            f = S[f"{p}.ln2_out"] = norm(ffn(y, f"{p}.ffn"), f"{p}.ln2_out")
            x = S[f"{p}.resid_post"] = residual(m, f, p, 2)
    x = S["ln_f"] = norm(x, "ln_f") if c.final_norm else x
    logits = S["logits"] = x @ W["head.weight" if "head.weight" in W else "embed.weight"].T
    S["probs"] = torch.exp(logits - torch.logsumexp(logits, -1, keepdim=True))
    if targets is not None:
        scored = targets != -100
        logp = logits - torch.logsumexp(logits, -1, keepdim=True)
        S["loss"] = -logp[scored].gather(-1, targets[scored][:, None]).mean()
    return S


# ---- fixtures -----------------------------------------------------------------------------------

SMALL = dict(vocab_size=11, max_seq_len=6, d_model=16, n_heads=2, n_layers=2, d_ff=24)
VARIANTS = {
    "post": dict(norm_position="post"),
    "pre": dict(norm_position="pre"),
    "sandwich": dict(norm_position="sandwich"),
    "parallel": dict(norm_position="parallel"),
    "parallel_shared": dict(norm_position="parallel_shared"),
    "parallel-rezero": dict(norm_position="parallel", residual="rezero", norm="none"),
    "rezero": dict(residual="rezero", norm="none"),
    "deepnorm": dict(residual="deepnorm"),
    "residual-none": dict(residual="none"),
    "norm-none": dict(norm="none", norm_position="pre"),
    "rms": dict(norm="rms", norm_position="pre"),
    "eps-outside-sqrt": dict(norm="eps_outside_sqrt"),
    "causal-pre": dict(causal=True, norm_position="pre", pos_encoding="learned"),
    # the modern block: rotary positions, grouped queries (2 query heads share 1 key/value head)
    "llama-like": dict(causal=True, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                       pos_encoding="rotary", n_kv_heads=1),
    "rotary-interleaved-partial": dict(causal=True, norm_position="parallel", pos_encoding="rotary",
                                       rotary_style="interleaved", rotary_fraction=0.5, rotary_base=100.0),
    "qwen2-like-window": dict(causal=True, norm_position="pre", norm="rms", bias=False, qkv_bias=True,
                              pos_encoding="rotary", sliding_window=2),
    # QK-norm: per head with grouped queries and rotary positions (Qwen3), over all heads in OLMo 2's
    # res-post-norm block, and a LayerNorm with a bias per head in a post-norm block
    "qwen3-like-qk-norm": dict(causal=True, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                               pos_encoding="rotary", n_kv_heads=1, qk_norm="head"),
    "olmo2-like-qk-norm": dict(causal=True, norm_position="res_post", norm="rms", bias=False,
                               pos_encoding="rotary", qk_norm="all_heads"),
    "res-post": dict(norm_position="res_post"),
    "simplified": dict(norm_position="simplified"),
    "simplified-deepnorm": dict(norm_position="simplified", residual="deepnorm"),
    "simplified-no-residual": dict(norm_position="simplified", residual="none", causal=True),
    "qk-layernorm-post": dict(qk_norm="head", eps=1e-3),
    "mqa-learned": dict(n_kv_heads=1, pos_encoding="learned"),
    # heads of their own width (Qwen3-0.6B: 16 x 128 on 1024): wider than d / h, and narrower
    "wide-heads-qk-norm-gqa": dict(head_dim=12, n_kv_heads=1, causal=True, norm_position="pre", norm="rms",
                                   pos_encoding="rotary", qk_norm="head"),
    "narrow-heads-all-heads-norm": dict(head_dim=4, qk_norm="all_heads", pos_encoding="learned"),
    "embed-sqrt-d-learned": dict(embed_scale="sqrt_d_model", embed_std=1.0, pos_encoding="learned",
                                 pos_std=0.5),
    "embed-none-no-positions": dict(embed_scale="none", embed_std=0.02, pos_encoding="none"),
    **{f"act-{a}": dict(activation=a) for a in bl.ACTIVATION_NAMES},
}


def small_model(dtype: torch.dtype = torch.float64, **fields: object) -> bl.Transformer:
    """A 2-block model whose norms and ReZero scales are moved off their init (so they matter)."""
    torch.manual_seed(0)
    model = bl.Transformer(bl.ModelConfig(**{**SMALL, **fields})).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.split(".")[-2]
            if "ln" in module or module.endswith("_norm") or name.endswith(".scale"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def tokens_and_targets() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SMALL["vocab_size"], (2, 5), generator=g)
    targets = torch.randint(0, SMALL["vocab_size"], (2, 5), generator=g)
    targets[0, :2] = -100
    return tokens, targets


# ---- the cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cache_equals_float64_recomputation_from_the_weights(variant: str) -> None:
    model = small_model(**VARIANTS[variant])
    tokens, targets = tokens_and_targets()
    (_, loss), cache = model.run_with_cache(tokens, targets=targets, names="*")  # blocklab's names
    expected = oracle(model, tokens, targets)
    assert list(cache) == list(expected)  # every stage, in the order the forward pass reaches it
    for name, want in expected.items():
        got = cache[name].to(torch.float64)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), name
        assert torch.allclose(got[finite], want[finite], rtol=1e-10, atol=1e-12), (
            name, float((got[finite] - want[finite]).abs().max()))
    assert torch.allclose(loss, expected["loss"], rtol=1e-12)


def test_float32_cache_of_the_listops_model_matches_the_float64_oracle() -> None:
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("listops-seed")).eval()
    tokens = torch.tensor([[11, 15, 2, 17, 7, 17, 3, 16]])
    _, cache = model.run_with_cache(tokens)
    expected = oracle(model, tokens)
    for name, want in expected.items():
        scale = float(want.abs().max())
        assert float((cache[name].double() - want).abs().max()) <= 2e-6 * max(scale, 1.0), name


def test_every_spec_stage_has_a_hook_name() -> None:
    names = set(bl.Transformer(bl.ModelConfig(**SMALL)).hook_names())
    block = ["resid_pre", "attn.q", "attn.k", "attn.v", "attn.scores", "attn.weights", "attn.z",
             "attn.result", "attn.out", "resid_mid", "ln1", "ffn.hidden", "ffn.act", "ffn.out", "resid_post",
             "ln2"]
    wanted = {"tok", "pos", "embed", "ln_f", "logits", "probs", "loss"}
    wanted |= {f"blocks.{i}.{s}" for i in range(2) for s in block}
    assert wanted <= names, wanted - names


# ---- hooks that change values -------------------------------------------------------------------


def zero(x: Tensor, name: str) -> Tensor:
    return torch.zeros_like(x)


@pytest.mark.parametrize(("variant", "sublayer"), [
    ("post", "blocks.0.attn"), ("pre", "blocks.1.ffn"),
    ("sandwich", "blocks.0.ffn"), ("rezero", "blocks.1.attn"),
])
def test_zeroing_a_sublayer_equals_the_model_with_that_sublayer_ablated(variant: str, sublayer: str) -> None:
    model = small_model(**VARIANTS[variant])
    tokens, targets = tokens_and_targets()
    with model.hooks({f"{sublayer}.out": zero}):
        logits, loss = model(tokens, targets=targets)
    ablated = oracle(model, tokens, targets, ablate=(sublayer,))
    intact = oracle(model, tokens, targets)
    assert torch.allclose(logits, ablated["logits"], rtol=1e-10, atol=1e-12)
    assert torch.allclose(loss, ablated["loss"], rtol=1e-10)
    assert not torch.allclose(logits, intact["logits"], atol=1e-6)  # the ablation did change something
    assert torch.allclose(model(tokens), intact["logits"], rtol=1e-10, atol=1e-12)  # and it is gone after


def test_a_hook_can_patch_one_position_from_another_run() -> None:
    model = small_model(norm_position="pre")
    tokens, _ = tokens_and_targets()
    clean, corrupt = tokens[:1], tokens[1:]
    _, clean_cache = model.run_with_cache(clean, names="blocks.0.resid_mid")

    def patch(x: Tensor, name: str) -> Tensor:
        x = x.clone()
        x[:, 2] = clean_cache[name][:, 2]
        return x

    with model.hooks({"blocks.0.resid_mid": patch}):
        _, patched = model.run_with_cache(corrupt, names="blocks.0.resid_mid")
    expected = oracle(model, corrupt)["blocks.0.resid_mid"].clone()
    expected[:, 2] = oracle(model, clean)["blocks.0.resid_mid"][:, 2]
    assert torch.allclose(patched["blocks.0.resid_mid"], expected, rtol=1e-10, atol=1e-12)


def test_reading_hooks_do_not_change_the_output_and_are_removed_after_an_error() -> None:
    model = small_model()
    tokens, _ = tokens_and_targets()
    seen: list[str] = []
    with model.hooks({"*": lambda x, name: seen.append(name)}):
        logits = model(tokens)
    assert torch.allclose(logits, oracle(model, tokens)["logits"], rtol=1e-10, atol=1e-12)
    assert seen[:5] == ["tok", "pos", "embed", "blocks.0.resid_pre", "blocks.0.attn.q"]
    assert seen[-1] == "probs"
    with pytest.raises(RuntimeError, match="boom"), model.hooks({"blocks.0.ln1": zero}):
        raise RuntimeError("boom")
    assert all(not p.fns for p in hook_points(model).values())


# ---- names ----------------------------------------------------------------------------------------


def test_name_filters_select_exactly_the_matching_stages() -> None:
    model = small_model(norm_position="pre")
    tokens, _ = tokens_and_targets()
    _, cache = model.run_with_cache(tokens, names="blocks.*.ln1")
    assert list(cache) == ["blocks.0.ln1", "blocks.1.ln1"]
    _, cache = model.run_with_cache(tokens, names=["embed", "blocks.1.attn.*"])
    attn = [f"blocks.1.attn.{s}" for s in ("q", "k", "v", "scores", "weights", "z", "result", "out")]
    assert list(cache) == ["embed", *attn]
    _, cache = model.run_with_cache(tokens, names=lambda n: n.endswith("resid_post"))
    assert list(cache) == ["blocks.0.resid_post", "blocks.1.resid_post"]
    _, cache = model.run_with_cache(tokens, names="*")
    assert len(cache) == len(model.hook_names()) - 1  # every stage but the loss (no targets)


def test_unknown_hook_names_are_errors_that_suggest_the_closest_name() -> None:
    model = small_model()
    suggestion = r"no hook point matches 'blocks\.0\.ln3'; did you mean .*blocks\.0\.ln1"
    with pytest.raises(ValueError, match=suggestion):
        with model.hooks({"blocks.0.ln1": zero, "blocks.0.ln3": zero}):
            pass
    assert all(not p.fns for p in hook_points(model).values())  # nothing half-attached
    with pytest.raises(ValueError, match="no hook point matches 'attn.weights'"):
        model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names="attn.weights")


def test_a_standalone_component_caches_under_its_own_names() -> None:
    ffn = bl.FeedForward(8, 16, "relu")
    x = torch.randn(2, 3, 8)
    out, cache = run_with_cache(ffn, x)
    assert list(cache) == ["hidden", "act", "out"]
    assert torch.allclose(cache["act"], (x @ ffn.w1.weight.T + ffn.w1.bias).clamp(min=0))
    assert torch.equal(cache["out"], out)


def test_hook_points_are_plain_attributes_until_replaced() -> None:
    block = bl.TransformerBlock(bl.ModelConfig(**SMALL))
    point = block._modules["hook_resid_mid"]
    assert block.__dict__["hook_resid_mid"] is point and point.stage == "resid_mid"
    replacement = bl.HookPoint()
    block.hook_resid_mid = replacement  # nn.Module.__setattr__ drops the shortcut
    assert block.hook_resid_mid is replacement and "hook_resid_mid" not in block.__dict__


def test_the_process_wide_count_of_attached_hooks_follows_every_change() -> None:
    from blocklab.nn.hooks import HookPoint, any_attached

    model = small_model()
    points = list(hook_points(model).values())
    start = HookPoint.attached  # other tests may leave functions on their own modules
    assert not any_attached(points)
    with model.hooks({"blocks.*.ln1": zero, "embed": zero}):
        assert HookPoint.attached == start + 3 and any_attached(points)
    assert HookPoint.attached == start and not any_attached(points)
    point = points[0]
    point.fns = [zero, zero]  # a plain list assigned wholesale is counted too
    point.fns.pop()
    point.fns *= 3
    assert HookPoint.attached == start + 3 and any_attached(points)
    del point.fns[1:]
    point.fns.clear()
    assert HookPoint.attached == start and not any_attached(points)

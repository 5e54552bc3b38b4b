"""diagnostics.py against a hand-built float64 model written here with plain torch ops."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import blocklab as bl
from blocklab.inspect.diagnostics import diagnose, diagnose_paths

B, T = 6, 8


def _pe(T: int, d: int) -> torch.Tensor:
    pe = torch.zeros(T, d, dtype=torch.float64)
    for p in range(T):
        for i in range(0, d, 2):
            pe[p, i] = math.sin(p / 10000 ** (i / d))
            if i + 1 < d:
                pe[p, i + 1] = math.cos(p / 10000 ** (i / d))
    return pe


def _ln(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


class Hand:
    """The stack of docs/concepts.md in plain float64 torch ops, keeping every intermediate."""

    def __init__(self, model: bl.Transformer):
        self.c = model.config
        self.p = {k: v.detach().double().clone().requires_grad_(True) for k, v in model.state_dict().items()}

    def attn(self, x, i, mask):
        p, h = self.p, self.c.n_heads
        d_k = self.c.d_model // h
        proj = lambda name: (x @ p[f"blocks.{i}.attn.{name}.weight"].T + p[f"blocks.{i}.attn.{name}.bias"]
                             ).view(B, T, h, d_k).transpose(1, 2)
        q, k, v = proj("q"), proj("k"), proj("v")
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        weights = torch.softmax(scores, -1)
        self.weights.append(weights)
        ctx = (weights @ v).transpose(1, 2).reshape(B, T, -1)
        return ctx @ p[f"blocks.{i}.attn.o.weight"].T + p[f"blocks.{i}.attn.o.bias"]

    def ffn(self, x, i):
        p = self.p
        hidden = x @ p[f"blocks.{i}.ffn.w1.weight"].T + p[f"blocks.{i}.ffn.w1.bias"]
        self.hidden.append(hidden)
        return torch.relu(hidden) @ p[f"blocks.{i}.ffn.w2.weight"].T + p[f"blocks.{i}.ffn.w2.bias"]

    def forward(self, tokens, targets, mask=None):
        p, c = self.p, self.c
        alpha = {"add": 1.0, "none": 0.0, "deepnorm": (2 * c.n_layers) ** 0.25}[c.residual]
        ln = lambda x, name: _ln(x, p[f"{name}.weight"], p[f"{name}.bias"])
        self.xs, self.ln_in, self.weights, self.hidden = [], [], [], []
        self.branch = []  # (connection input, branch output F(x)) per sublayer
        factor = {"sqrt_d_model": math.sqrt(c.d_model), "none": 1.0}[c.embed_scale]  # Vaswani et al. 3.4
        self.tok, self.pos = factor * p["embed.weight"][tokens], _pe(T, c.d_model).expand(B, T, c.d_model)
        x = self.tok + self.pos
        for i in range(c.n_layers):
            self.xs.append(x)
            if c.norm_position == "post":
                a = self.attn(x, i, mask)
                self.branch.append((x, a))
                m = alpha * x + a
                y = ln(m, f"blocks.{i}.ln1")
                f = self.ffn(y, i)
                self.branch.append((y, f))
                z = alpha * y + f
                self.ln_in += [m, z]
                x = ln(z, f"blocks.{i}.ln2")
            else:
                a = self.attn(ln(x, f"blocks.{i}.ln1"), i, mask)
                self.branch.append((x, a))
                m = alpha * x + a
                f = self.ffn(ln(m, f"blocks.{i}.ln2"), i)
                self.branch.append((m, f))
                self.ln_in += [x, m]
                x = alpha * m + f
        self.xs.append(x)
        if c.final_norm:
            x = ln(x, "ln_f")
        logits = x @ p["head.weight"].T
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def _batch(config, seed=0, padded=False):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, config.vocab_size, (B, T), generator=g)
    targets[:, :3] = -100
    mask = None
    if padded:
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, 5:], mask[3, 2:] = 0, 0
    return tokens, targets, mask


def _model(**overrides):
    torch.manual_seed(0)
    config = bl.preset("listops-seed", d_model=16, n_heads=2, d_ff=32, n_layers=3, **overrides)
    model = bl.Transformer(config).double()
    with torch.no_grad():  # make the branches matter: weights larger than the 0.02 init
        for name, param in model.named_parameters():
            if name.endswith("weight") and param.dim() == 2 and name.startswith("blocks"):
                param.normal_(0, 0.3)
    return model


@pytest.mark.parametrize(
    "norm_position,residual",
    [("post", "add"), ("pre", "add"), ("post", "none"), ("pre", "none"), ("post", "deepnorm")],
)
def test_gradient_flow_equals_float64_autograd_on_hand_built_model(norm_position, residual):
    model = _model(norm_position=norm_position, residual=residual)
    tokens, targets, mask = _batch(model.config, padded=True)
    diag = diagnose(model, tokens, targets, attention_mask=mask)

    hand = Hand(model)
    loss = hand.forward(tokens, targets, mask)
    assert diag.loss == pytest.approx(float(loss.detach()), rel=1e-6)
    block_params = {k: v for k, v in hand.p.items() if k.startswith("blocks.")}
    grads = torch.autograd.grad(loss, hand.xs + list(block_params.values()), retain_graph=True)
    x_grads, p_grads = grads[: len(hand.xs)], dict(zip(block_params, grads[len(hand.xs):], strict=True))
    for layer in diag.layers:
        assert layer.grad_resid == pytest.approx(float(x_grads[layer.layer].norm()), rel=1e-5)
        for group in ("attn", "ffn.w1", "ffn.w2", "ln2"):
            full = f"blocks.{layer.layer}.{group}."
            expected = math.sqrt(sum(float(g.norm()) ** 2 for k, g in p_grads.items() if k.startswith(full)))
            assert layer.grad_params[group] == pytest.approx(expected, rel=1e-5), group
    assert diag.grad_resid_out == pytest.approx(float(x_grads[-1].norm()), rel=1e-5)

    # identity and branch paths: alpha g (alpha 1 for add, 0 without residual) and J_F(x)^T g
    alpha = {"add": 1.0, "none": 0.0, "deepnorm": (2 * 3) ** 0.25}[residual]
    for k, (x, f) in enumerate(hand.branch):
        layer, kind = diag.layers[k // 2], ("attn", "ffn")[k % 2]
        g_x, g_f = torch.autograd.grad(loss, [x, f], retain_graph=True)
        (branch,) = torch.autograd.grad(f, x, g_f, retain_graph=True)
        paths = layer.residual[kind]
        assert paths.total == pytest.approx(float(g_x.norm()), rel=1e-5)
        assert paths.branch == pytest.approx(float(branch.norm()), rel=1e-5)
        assert paths.identity == pytest.approx(alpha * float(g_f.norm()), rel=1e-5)  # dL/dF = dL/dout


def test_identity_plus_branch_sums_to_the_total_gradient():
    variants = [("post", "add"), ("pre", "add"), ("sandwich", "add"), ("post", "deepnorm"), ("pre", "none")]
    for norm_position, residual in variants:
        model = _model(norm_position=norm_position, residual=residual)
        tokens, targets, _ = _batch(model.config, seed=1)
        paths = diagnose_paths(model, tokens, targets)
        assert len(paths) == 3
        for layer in paths:
            for kind, t in layer.items():
                assert t["total"].norm() > 0
                torch.testing.assert_close(t["identity"] + t["branch"], t["total"], rtol=1e-9, atol=1e-12,
                                           msg=f"{norm_position} {residual} {kind}")


def test_the_simplified_block_has_one_connection_whose_paths_sum_to_the_total_gradient():
    """LN1(x + FFN(MHA(x))): attention has no connection of its own; the FFN's connection reads x
    (resid_pre), its total is dL/dx, and the identity carries dL/d(resid_post) unchanged (add)."""
    model = _model(norm_position="simplified")
    tokens, targets, _ = _batch(model.config, seed=1)
    paths = diagnose_paths(model, tokens, targets)
    _, cache = model.run_with_cache(tokens, targets=targets, backward=True)  # the hook API's gradients
    for i, layer in enumerate(paths):
        assert list(layer) == ["ffn"]
        t = layer["ffn"]
        torch.testing.assert_close(t["total"], cache.grads[f"blocks.{i}.resid_pre"], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(t["identity"], cache.grads[f"blocks.{i}.resid_post"], rtol=1e-9,
                                   atol=1e-12)
        assert t["branch"].norm() > 0
        torch.testing.assert_close(t["identity"] + t["branch"], t["total"], rtol=1e-9, atol=1e-12)
    diag = diagnose(model, tokens, targets)
    assert [set(layer.residual) for layer in diag.layers] == [{"ffn"}] * 3
    assert "attn_identity" not in diag.summary() and len(diag.summary()["ffn_identity"]) == 3


@pytest.mark.parametrize("norm_position", ["parallel", "parallel_shared"])
def test_in_the_parallel_block_identity_and_both_branches_sum_to_the_total_gradient(norm_position):
    """x + MHA(LN1(x)) + FFN(LN2(x)): one x, two branches; each sublayer's path is its own branch, and
    the identity plus both branches is dL/dx (against autograd through the block's own output)."""
    model = _model(norm_position=norm_position)
    tokens, targets, _ = _batch(model.config, seed=1)
    paths = diagnose_paths(model, tokens, targets)
    for layer in paths:
        attn, ffn = layer["attn"], layer["ffn"]
        torch.testing.assert_close(attn["total"], ffn["total"], rtol=0, atol=0)  # the same x
        torch.testing.assert_close(attn["identity"], ffn["identity"], rtol=0, atol=0)
        assert attn["branch"].norm() > 0 and ffn["branch"].norm() > 0
        torch.testing.assert_close(attn["identity"] + attn["branch"] + ffn["branch"], attn["total"],
                                   rtol=1e-9, atol=1e-12)


def _measured_and_by_hand(model, seed):
    """The model's diagnostics and a float64 hand forward on one padded batch, and its valid positions."""
    tokens, targets, mask = _batch(model.config, seed=seed, padded=True)
    diag = diagnose(model, tokens, targets, attention_mask=mask)
    hand = Hand(model)
    with torch.no_grad():
        hand.forward(tokens, targets, mask)
    return diag, hand, mask.bool()


def test_forward_statistics_equal_hand_computation():
    model = _model(norm_position="pre")
    diag, hand, valid = _measured_and_by_hand(model, seed=3)
    rel = 1e-6  # the model's sinusoidal table is stored in float32; the hand one is float64
    for layer in diag.layers:
        i = layer.layer
        x = hand.xs[i][valid]
        assert layer.resid_norm == pytest.approx(float(x.norm(dim=-1).mean()), rel=rel)
        assert layer.resid_var == pytest.approx(float(((x - x.mean()) ** 2).mean()), rel=rel)
        for ln, z in zip(("ln1", "ln2"), hand.ln_in[2 * i: 2 * i + 2], strict=True):
            z = z[valid]
            assert layer.norm_inputs[ln]["mu"] == pytest.approx(float(z.mean(-1).mean()), rel=rel, abs=1e-12)
            var = float(z.var(-1, unbiased=False).mean())
            assert layer.norm_inputs[ln]["var"] == pytest.approx(var, rel=rel)
        h = hand.hidden[i][valid]  # (N_valid, d_ff)
        assert layer.ffn_frac_le0 == pytest.approx(float((h <= 0).double().mean()), abs=0)
        never_positive = [j for j in range(h.shape[1]) if all(float(v) <= 0 for v in h[:, j])]
        assert layer.ffn_dead == pytest.approx(len(never_positive) / h.shape[1], abs=0)
        w = hand.weights[i]  # (B, h, T, T)
        for head in range(2):
            rows = [-sum(float(p) * math.log(float(p)) for p in w[b, head, t] if p > 0)
                    for b in range(B) for t in range(T) if valid[b, t]]
            assert layer.attn_entropy[head] == pytest.approx(sum(rows) / len(rows), rel=rel)


@pytest.mark.parametrize("embed_scale", ["sqrt_d_model", "none"])
def test_token_and_position_parts_of_x0_equal_hand_computation(embed_scale):
    model = _model(norm_position="pre", embed_scale=embed_scale, embed_std=0.3)
    diag, hand, valid = _measured_and_by_hand(model, seed=5)
    tok, pos = hand.tok[valid].norm(dim=-1), hand.pos[valid].norm(dim=-1)  # (N_valid,) each
    share = [float(a) / (float(a) + float(b)) for a, b in zip(tok, pos, strict=True)]
    e = diag.embedding
    assert e["tok_l2"] == pytest.approx(float(tok.mean()), rel=1e-6)
    assert e["pos_l2"] == pytest.approx(float(pos.mean()), rel=1e-6)  # sqrt(d/2) at every position
    assert e["pos_l2"] == pytest.approx(math.sqrt(16 / 2), rel=1e-6)
    assert e["tok_share"] == pytest.approx(sum(share) / len(share), rel=1e-6)
    assert diag.summary()["embed_tok_share"] == e["tok_share"]


def test_measure_leaves_grads_rng_and_batchnorm_running_stats_untouched():
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("listops-seed", norm="batch", n_layers=2, dropout=0.1))
    tokens, targets, _ = _batch(model.config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    diag = diagnose(model, tokens, targets)
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert diag.layers[1].grad_params["ln1"] > 0


def test_diagnose_cli_json_at_init(capsys):
    from blocklab.cli import main

    assert main(["diagnose", "--n-layers", "3", "--d-model", "16", "--n-heads", "2", "--d-ff", "32",
                 "--norm-position", "pre", "--batch-size", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["n_layers"] == 3 and len(out["layers"]) == 3
    from blocklab.tasks import get_task  # the loss of the same seeded model on the same 8 examples

    torch.manual_seed(0)
    model, data = bl.Transformer(bl.ModelConfig(**out["config"])), get_task("listops").split("train")
    logits = model(data.inputs[:8])
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), data.targets[:8].flatten(),
                                                 ignore_index=-100)
    assert out["loss"] == pytest.approx(float(expected), rel=1e-5)
    for layer in out["layers"]:
        assert set(layer["grad_params"]) >= {"attn", "ffn.w1", "ffn.w2", "ln1", "ln2"}
        assert layer["residual"]["ffn"]["identity"] > layer["residual"]["ffn"]["branch"] > 0
        assert 0.3 < layer["ffn_frac_le0"] < 0.7 and len(layer["attn_entropy"]) == 2
    assert main(["diagnose", "--batch-size", "0"]) == 2


def test_logging_diagnostics_during_training_does_not_change_the_run():
    from blocklab.inspect.diagnostics import DiagnosticsLogger
    from blocklab.tasks import get_task
    from blocklab.training.loop import TrainConfig, train

    task = get_task("listops")
    config = bl.preset("listops-seed", d_model=16, n_heads=2, d_ff=32, dropout=0.1, **task.config_overrides())
    tc = TrainConfig(steps=4, batch_size=16, warmup=1, eval_every=4, log_every=1, target_accuracy=None)
    plain = train(config, tc, task, None, report=False)
    logged = train(config, tc, task, None, callbacks=[DiagnosticsLogger(2)], report=False)
    assert [r["loss"] for r in logged.history] == [r["loss"] for r in plain.history]  # bit for bit
    diag = {r["step"]: r["diag"] for r in logged.history if "diag" in r}
    assert sorted(diag) == [1, 2, 4]
    assert len(diag[2]["grad_resid"]) == 3 and len(diag[2]["ln1_in_var"]) == 2
    with pytest.raises(ValueError, match="log-diagnostics"):
        DiagnosticsLogger(0)


def test_a_mixture_reports_each_experts_tokens_and_its_hidden_units_without_padding() -> None:
    # the oracle: torch forward hooks on each router (top-k of its logits) and on each expert's w1
    torch.manual_seed(0)
    config = bl.ModelConfig(vocab_size=20, max_seq_len=T, d_model=16, n_heads=2, d_ff=24, n_layers=2,
                            norm="rms", norm_position="pre", causal=True, n_experts=4, experts_per_token=2)
    model = bl.Transformer(config)
    seen: dict[str, torch.Tensor] = {}
    for i, block in enumerate(model.blocks):
        block.ffn.router.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"{i}.router", out))
        for e, expert in enumerate(block.ffn.experts):
            expert.w1.register_forward_hook(lambda m, a, out, k=f"{i}.{e}": seen.__setitem__(k, out))
    tokens = torch.randint(0, 20, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :3] = 0  # left padding: its tokens are routed, but not counted
    diag = diagnose(model, tokens, tokens, mask)
    for i, layer in enumerate(diag.layers):
        chosen = seen[f"{i}.router"].topk(2, dim=-1).indices  # (B, T, 2)
        assert layer.expert_tokens == torch.bincount(chosen[mask.bool()].flatten(), minlength=4).tolist()
        keep = mask.bool().flatten()
        # an expert's rows: the tokens that chose it first, then second (transformers' loop's order)
        hidden = [seen[f"{i}.{e}"][keep[torch.where(chosen.reshape(-1, 2).T == e)[1]]] for e in range(4)]
        everything = torch.cat(hidden)
        assert layer.ffn_frac_le0 == pytest.approx(float((everything <= 0).double().mean()), abs=1e-12)

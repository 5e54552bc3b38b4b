"""BatchNorm over batch and positions (norm="batch") against torch.nn.BatchNorm1d."""

import torch

import blocklab as bl
from blocklab.nn.batchnorm import BatchNorm
from blocklab.nn.params import count_parameters


def test_batchnorm_matches_torch_batchnorm1d_in_train_and_eval():
    torch.manual_seed(0)
    ours, ref = BatchNorm(6).double(), torch.nn.BatchNorm1d(6).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2), ours.bias.uniform_(-1, 1)
        ref.weight.copy_(ours.weight), ref.bias.copy_(ours.bias)
    for _ in range(3):
        x = torch.randn(5, 7, 6, dtype=torch.float64) * 3 + 1
        torch.testing.assert_close(ours(x), ref(x.reshape(-1, 6)).reshape(5, 7, 6), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-12, atol=1e-12)
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x), ref(x.reshape(-1, 6)).reshape(5, 7, 6), rtol=1e-12, atol=1e-12)


def test_batchnorm_leaves_padded_positions_out_of_its_statistics():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:], pad[2, 1:] = True, True
    ours, ref = BatchNorm(4).double(), torch.nn.BatchNorm1d(4).double()
    out = ours(x, pad)
    ref(x[~pad])  # reference statistics from the 8 real positions only
    mean, var = x[~pad].mean(0), x[~pad].var(0, unbiased=False)
    torch.testing.assert_close(out, (x - mean) / torch.sqrt(var + 1e-5), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-12, atol=1e-12)


def test_model_with_batch_norm_counts_2d_parameters_per_norm():
    config = bl.preset("listops-seed", norm="batch")
    model = bl.Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(config).total
    assert count_parameters(config).per_layer["ln1"] == 2 * 64
    assert {n for n, _ in model.blocks[0].ln1.named_buffers()} == {"running_mean", "running_var"}


def test_a_batch_norm_model_ignores_what_stands_at_padded_positions():
    """With the attention mask, padded positions reach no statistic and no real position: what the
    padding holds changes nothing (in training, where BatchNorm uses the batch's statistics)."""
    torch.manual_seed(3)
    model = bl.Transformer(bl.preset("listops-seed", norm="batch", norm_position="pre")).train()
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    tokens = torch.randint(1, 18, (2, 8))
    other = tokens.clone()
    other[1, 5:] = (tokens[1, 5:] + 7) % 18  # different tokens where the mask says padding
    real = mask.bool()
    a, b = model(tokens, attention_mask=mask), model(other, attention_mask=mask)
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-6)
    assert not torch.allclose(model(tokens)[real], model(other)[real], atol=1e-3)  # unmasked, they leak

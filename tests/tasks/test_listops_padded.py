"""listops-padded: variable-length ListOps whose batches are padded, and padding that changes nothing:
the split carries the attention mask, the trainer and evaluation pass it, attention skips the pads and
BatchNorm leaves them out of its statistics."""

import pytest
import torch
import torch.nn.functional as F

from blocklab.nn.model import Transformer
from blocklab.nn.presets import preset
from blocklab.tasks import IGNORE_INDEX, PaddedListOpsTask, get_task
from blocklab.training.loop import TrainConfig, batch_indices, evaluate, train

SMALL = {"n_train": 300, "n_test": 50}


def test_padded_listops_answers_lengths_and_disjoint_splits():
    task = get_task("listops-padded", **SMALL, seed=3)
    assert isinstance(task, PaddedListOpsTask) and task.seq_len == 10
    train_split, test = task.split("train"), task.split("test")
    pad = task.tokenizer.pad_id
    rows = lambda d: {tuple(r) for r in d.inputs.tolist()}
    assert not rows(train_split) & rows(test) and len(rows(test)) == 50
    lengths = set()
    for inputs, targets in zip(test.inputs.tolist(), test.targets.tolist(), strict=True):
        tokens = [task.tokenizer.tokens([i])[0] for i in inputs if i != pad]
        lengths.add(len(tokens))
        digits = [int(t) for t in tokens[2:-1:2]]
        op = tokens[0]
        answer = {"Max": max(digits), "Min": min(digits), "First": digits[0], "Last": digits[-1]}[op]
        scored = [(i, t) for i, t in enumerate(targets) if t != IGNORE_INDEX]
        assert scored == [(len(tokens) - 1, task.tokenizer.token_to_id[str(answer)])]
        assert inputs[len(tokens) :] == [pad] * (10 - len(tokens))
    assert lengths == {4, 6, 8, 10}  # 1 to 4 arguments: every batch is padded


def test_padded_listops_queries_are_unpadded():
    task = PaddedListOpsTask()
    ids, positions = task.encode_query("Min ( 7 , 2 )")
    assert positions == [5] and len(ids) == 6 and task.tokenizer.pad_id not in ids
    for bad in ("Min ( 7 2 )", "Min ( 7 , 2 , 1 , 4 , 5 )", "Foo ( 1 )", "Max ( 12 )"):
        with pytest.raises(ValueError, match="listops-padded input"):
            task.encode_query(bad)


def test_a_task_that_pads_carries_the_mask_and_one_that_does_not_carries_none():
    task = get_task("listops-padded", **SMALL)
    for split in ("train", "test"):
        data = task.split(split)
        assert torch.equal(data.attention_mask, (data.inputs != task.tokenizer.pad_id).long())
        assert data.attention_mask.sum() < data.attention_mask.numel()
    assert get_task("listops").split("train").attention_mask is None  # no pads, no mask


def _unpadded_rows(task, inputs, targets):
    """Each padded row cut to its real tokens: (ids (1, L), targets (1, L)) per example."""
    pad = task.tokenizer.pad_id
    return [(x[x != pad][None], y[x != pad][None]) for x, y in zip(inputs, targets, strict=True)]


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_padded_logits_at_real_positions_equal_the_unpadded_example(norm_position):
    task = get_task("listops-padded", **SMALL)
    data = task.split("test")
    x, y, mask = data.inputs[:16], data.targets[:16], data.attention_mask[:16]
    model = Transformer(preset("listops-seed", **task.config_overrides(), norm_position=norm_position)).eval()
    with torch.no_grad():
        padded = model(x, attention_mask=mask)  # (16, 10, vocab)
        unmasked = model(x)
        for i, (xi, _) in enumerate(_unpadded_rows(task, x, y)):
            alone = model(xi)[0]  # (L, vocab), no padding at all
            torch.testing.assert_close(padded[i, : len(alone)], alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(padded[mask.bool()], unmasked[mask.bool()], atol=1e-3)  # the mask mattered


def test_batchnorm_statistics_exclude_pads():
    task = get_task("listops-padded", **SMALL)
    data = task.split("train")
    x, mask = data.inputs[:32], data.attention_mask[:32]
    other = x.clone()
    other[mask == 0] = task.tokenizer.token_to_id["7"]  # different tokens where the pads are
    config = preset("listops-seed", **task.config_overrides(), norm="batch")
    models = []
    for tokens in (x, other):
        torch.manual_seed(0)
        model = Transformer(config).train()
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, attention_mask=mask, names="blocks.0.resid_mid")
        models.append((model, logits, cache["blocks.0.resid_mid"]))
    (model, logits, resid_mid), (model_other, logits_other, _) = models
    real = mask.bool()
    bn = model.blocks[0].ln1
    # one training-mode forward: running mean = momentum * mean over the real positions only
    torch.testing.assert_close(bn.running_mean, bn.momentum * resid_mid[real].mean(0), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(bn.running_mean, bn.momentum * resid_mid.flatten(0, 1).mean(0), atol=1e-4)
    # what sits at the pads changes nothing: not the real positions' outputs, not the statistics
    torch.testing.assert_close(logits[real], logits_other[real], rtol=1e-5, atol=1e-6)
    for name, buffer in model.named_buffers():
        torch.testing.assert_close(buffer, dict(model_other.named_buffers())[name], rtol=1e-5, atol=1e-7)


def test_the_trainer_and_evaluate_pass_the_mask():
    task = get_task("listops-padded", **SMALL)
    config = preset("listops-seed", **task.config_overrides(), d_model=32, d_ff=64)
    tc = TrainConfig(steps=1, batch_size=16, warmup=0, eval_every=1, log_every=1, checkpoint_every=0,
                     target_accuracy=None, seed=3)  # fmt: skip
    torch.manual_seed(tc.seed)
    fresh = Transformer(config)
    run = train(config, tc, task, report=False)
    batch = batch_indices(1, len(task.split("train")), tc.batch_size, tc.seed)
    data = task.split("train")
    with torch.no_grad():  # the first step's loss: each example alone, unpadded, then the mean
        rows = _unpadded_rows(task, data.inputs[batch], data.targets[batch])
        losses = [fresh(xi, yi)[1] for xi, yi in rows]
    assert run.history[0]["loss"] == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)
    test = task.split("test")
    got = evaluate(run.model, test)
    with torch.no_grad():
        run.model.eval()
        alone = [(run.model(xi)[0], yi[0]) for xi, yi in _unpadded_rows(task, test.inputs, test.targets)]
    correct = sum(bool((lg.argmax(-1) == t)[t != IGNORE_INDEX].all()) for lg, t in alone)
    loss = torch.stack([F.cross_entropy(lg, t, ignore_index=IGNORE_INDEX) for lg, t in alone]).mean()
    assert got["accuracy"] == pytest.approx(correct / len(alone))
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5)

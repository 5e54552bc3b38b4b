"""listops-padded: variable-length ListOps for the padded-batch experiments."""

import pytest

from blocklab.experiments.padded import PaddedListOpsTask
from blocklab.experiments.runs import build_task


def test_padded_listops_answers_lengths_and_disjoint_splits():
    task = build_task({"name": "listops-padded", "n_train": 300, "n_test": 50, "seed": 3})
    assert isinstance(task, PaddedListOpsTask) and task.seq_len == 10
    train, test = task.split("train"), task.split("test")
    pad = task.tokenizer.pad_id
    rows = lambda d: {tuple(r) for r in d.inputs.tolist()}  # noqa: E731
    assert not rows(train) & rows(test) and len(rows(test)) == 50
    lengths = set()
    for inputs, targets in zip(test.inputs.tolist(), test.targets.tolist(), strict=True):
        tokens = [task.tokenizer.tokens([i])[0] for i in inputs if i != pad]
        lengths.add(len(tokens))
        digits = [int(t) for t in tokens[2:-1:2]]
        op = tokens[0]
        answer = {"Max": max(digits), "Min": min(digits), "First": digits[0], "Last": digits[-1]}[op]
        scored = [(i, t) for i, t in enumerate(targets) if t != -100]
        assert scored == [(len(tokens) - 1, task.tokenizer.token_to_id[str(answer)])]
        assert inputs[len(tokens):] == [pad] * (10 - len(tokens))
    assert lengths == {4, 6, 8, 10}  # 1 to 4 arguments: every batch is padded


def test_padded_listops_queries():
    task = PaddedListOpsTask()
    ids, positions = task.encode_query("Min ( 7 , 2 )")
    assert positions == [5] and len(ids) == 10 and ids[6:] == [task.tokenizer.pad_id] * 4
    for bad in ("Min ( 7 2 )", "Min ( 7 , 2 , 1 , 4 , 5 )", "Foo ( 1 )", "Max ( 12 )"):
        with pytest.raises(ValueError, match="listops-padded input"):
            task.encode_query(bad)

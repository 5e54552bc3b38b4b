"""gelu-vs-relu's checks either side of their thresholds; a diverged run's loss counts against it."""

from blocklab.lab.claims import gelu_vs_relu as claim


def numbers(relu_acc=0.9, gelu_acc=0.9, relu_loss=0.3, gelu_loss=0.3, ratio=1.1):
    return {
        "relu": {"accuracy": [relu_acc, 0.9], "eval_loss": [relu_loss, 0.3]},
        "gelu": {"accuracy": [gelu_acc, 0.9], "eval_loss": [gelu_loss, 0.3]},
        "time_ratio": ratio,
    }


def test_gelu_accuracy_at_least_relus(threshold):
    threshold(claim.verdict, numbers(gelu_acc=0.9), numbers(gelu_acc=0.8975), 0)


def test_gelu_loss_at_most_relus(threshold):
    threshold(claim.verdict, numbers(gelu_loss=0.3), numbers(gelu_loss=0.3001), 1)


def test_diverged_gelu_run_loses_on_loss(threshold):
    threshold(claim.verdict, numbers(gelu_loss=0.3), numbers(gelu_loss=None), 1)


def test_small_extra_cost(threshold):
    threshold(claim.verdict, numbers(ratio=1.5), numbers(ratio=1.51), 2)

"""relu-sparsity's checks either side of 40% and 60%."""

import pytest

from blocklab.lab.claims import relu_sparsity as claim


def numbers(init=(0.5, 0.5), trained=(0.5, 0.5)):
    return {"init": list(init), "trained": list(trained)}


@pytest.mark.parametrize("inside, outside", [(0.4, 0.399), (0.6, 0.601)])
@pytest.mark.parametrize("index, part", [(0, "init"), (1, "trained")])
def test_about_half_in_every_layer(threshold, index, part, inside, outside):
    threshold(claim.verdict, numbers(**{part: (0.5, inside)}), numbers(**{part: (0.5, outside)}), index)

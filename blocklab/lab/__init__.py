"""The lab: ablation grids (many training runs over a grid of settings, in worker processes) and the
named claims about the block, each measured in its source's setup with a verdict.

May import: errors, version, device, files, nn, tasks, inspect, training, weights.
"""

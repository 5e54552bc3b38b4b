"""The lab: ablation grids (many training runs over a grid of settings) and the named claims about the
block, each measured in its source's setup with a verdict; their training runs go to an executor
(local worker processes, or a Ray cluster).

May import: errors, version, device, files, nn, tasks, inspect, training, weights.
"""

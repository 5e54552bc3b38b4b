"""Training a model: the step loop, the run (its folder's files, checkpoints, resume and report), the
train config and the state a resume needs, and data parallelism across processes.

May import: errors, version, device, files, nn, tasks, inspect.
"""

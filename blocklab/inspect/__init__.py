"""Reading a model through its hook points: the tracer (every number of one forward, in text, JSON and
HTML), gradient-flow and forward diagnostics, and the detection of non-finite values.

May import: errors, device, nn, tasks.
"""

"""The model: the config and its presets, the block's layouts, the variants' records (norm, activation
and FFN kinds), the components (activations, norms, attention, feed-forward, embeddings, the lean
kernels and their saved-bytes ledger), the block, the stack, parameter counts and the memory guard;
the hook points every stage carries, the activation cache a forward returns, tokens in and out, and
generation. Everything a forward pass needs, and nothing that trains, loads, inspects or measures a
model.

May import: errors, device.
"""

"""The lab: ablation grids and named, reproducible claims about the block."""

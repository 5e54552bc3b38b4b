"""The files blocklab writes and reads, and the rule that it writes only into its own: atomic writes,
strict JSON, and the folders a command may claim (markers, locks, output paths).

May import: errors, version.
"""

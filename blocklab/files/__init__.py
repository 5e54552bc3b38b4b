"""The files blocklab writes and reads, and the rule that it writes only into its own: the one writer
(atomic, never through a symbolic link), the one reader (regular files only, capped), strict JSON
(depth-capped, schema-checked), and the folders a command may claim (markers, locks, output paths).

May import: errors, version.
"""

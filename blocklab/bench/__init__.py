"""`blocklab bench`: one block against its peers, measured in one run on this machine (the runner, the
blocks it times, the statistics and memory probes, the report and its JSON schema).

May import: errors, version, device, files, nn.
"""

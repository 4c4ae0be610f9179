"""Command-line tools, run as modules from the repository root: `python -m tools.convert_checkpoint ...`,
`torchrun --nproc_per_node 4 -m tools.check_layouts ...` (the root is then on the import path; no tool edits
`sys.path`)."""

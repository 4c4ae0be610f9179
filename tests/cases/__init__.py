"""Named cases of the shared worker (tests/worker.py): code that runs inside launched processes, not tests."""

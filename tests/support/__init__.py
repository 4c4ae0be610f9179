"""What tests share: paths, ports, tiny models and checkpoints, fault-injection helpers (not test modules)."""

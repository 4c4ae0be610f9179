"""Checkpoint conversion, apart from resume state (`rlhf_mcore.checkpoint`): the megatron side of HF <-> mcore
conversion (`mcore`: build a model for a role, load a full state dict into this rank's shard, save / read
converted dist-checkpoints; driven by `tools/convert_checkpoint.py`) and the HF export of a trained actor
(`export`: `export_actor_to_hf`, and its CLI `python -m rlhf_mcore.convert.export`)."""

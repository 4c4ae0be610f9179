"""rlhf-mcore: RL post-training (PPO, GRPO and variants) of LLMs on megatron-core, as one SPMD program."""
import warnings

# megatron-core warns once per module when TE/apex are absent; we log the path that runs instead
# (rlhf_mcore.models.build logs the layer spec, rlhf_mcore.cpu_compat the CPU patches).
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
warnings.filterwarnings("ignore", message=".*Apex is not installed.*")

__version__ = "0.1.0"

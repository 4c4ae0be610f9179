"""rlhf-mcore: RL post-training (PPO, GRPO and variants) of LLMs on megatron-core, as one SPMD program."""
import warnings

# megatron-core warns once per module when TE/apex are absent; we log the path that runs instead
# (rlhf_mcore.models.build logs the layer spec, rlhf_mcore.cpu_compat the CPU patches).
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
warnings.filterwarnings("ignore", message=".*Apex is not installed.*")
# Deprecation notices from inside megatron-core / torch.distributed.checkpoint that users cannot act on.
warnings.filterwarnings("ignore", message=".*full scope is deprecated.*")
warnings.filterwarnings("ignore", message=".*Please use DTensor instead.*")
warnings.filterwarnings("ignore", message=".*`load_state_dict` is deprecated.*")

__version__ = "0.1.0"

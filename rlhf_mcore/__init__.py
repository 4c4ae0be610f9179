"""rlhf-mcore: RL post-training (PPO, GRPO and variants) of LLMs on megatron-core, as one SPMD program."""
import sys
import warnings

from rlhf_mcore.import_hooks import AfterImport

# megatron-core warns once per module when TE/apex are absent; we log the path that runs instead
# (rlhf_mcore.models.build logs the layer spec, rlhf_mcore.cpu_compat the CPU patches).
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
warnings.filterwarnings("ignore", message=".*Apex is not installed.*")
# Deprecation notices from inside megatron-core / torch.distributed.checkpoint that users cannot act on.
warnings.filterwarnings("ignore", message=".*full scope is deprecated.*")
warnings.filterwarnings("ignore", message=".*Please use DTensor instead.*")
warnings.filterwarnings("ignore", message=".*`load_state_dict` is deprecated.*")

__version__ = "0.1.0"


def _without_jit_fuser(module) -> None:
    """Runs `cpu_compat.without_jit_fuser` on megatron.core.jit as soon as it has executed, before any fusion module
    decorates a kernel with its `jit_fuser` (a process that imports megatron before rlhf_mcore is left as it is)."""
    from rlhf_mcore.cpu_compat import without_jit_fuser

    without_jit_fuser(module)


sys.meta_path.insert(0, AfterImport("megatron.core.jit", _without_jit_fuser))

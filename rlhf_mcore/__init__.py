"""rlhf-mcore: RL post-training (PPO, GRPO and variants) of LLMs on megatron-core, as one SPMD program."""
import importlib.abc
import importlib.machinery
import sys
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


class _AfterMegatronJit(importlib.abc.MetaPathFinder):
    """Runs `cpu_compat.without_jit_fuser` on megatron.core.jit as soon as it has executed, before any fusion module
    decorates a kernel with its `jit_fuser` (a process that imports megatron before rlhf_mcore is left as it is)."""

    def find_spec(self, name, path, target=None):
        if name != "megatron.core.jit":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from rlhf_mcore.cpu_compat import without_jit_fuser

            without_jit_fuser(module)
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterMegatronJit())

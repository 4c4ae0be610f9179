"""The run's configuration: typed sections (`schema`), YAML + `a.b=value` loading (`load`), and the
cross-section rules checked before anything is built (`validate`).

    cfg = load_config("configs/tiny_grpo.yaml", ["trainer.total_steps=3"], world_size=2)
"""
from rlhf_mcore.config.load import ConfigError, all_keys, dump_yaml, load_config
from rlhf_mcore.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    Config,
    CriticConfig,
    DataConfig,
    ModelConfig,
    NativeRolloutConfig,
    OptimConfig,
    ParallelConfig,
    RefConfig,
    RewardConfig,
    RolloutConfig,
    SGLangRolloutConfig,
    TrainerConfig,
    UpdateConfig,
)
from rlhf_mcore.config.validate import validate

__all__ = [
    "ActorConfig", "AlgorithmConfig", "Config", "ConfigError", "CriticConfig", "DataConfig", "ModelConfig",
    "NativeRolloutConfig", "OptimConfig", "ParallelConfig", "RefConfig", "RewardConfig", "RolloutConfig",
    "SGLangRolloutConfig", "TrainerConfig", "UpdateConfig", "all_keys", "dump_yaml", "load_config", "validate",
]

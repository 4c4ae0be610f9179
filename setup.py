from setuptools import find_packages, setup

setup(
    name="rlhf-mcore",
    version="0.1.0",
    description="RL post-training (PPO, GRPO and variants) for LLMs on megatron-core, one SPMD program.",
    license="Apache-2.0",  # SPDX expression; the text is LICENSE at the top level
    license_files=["LICENSE"],
    # kernels/ is imported as rlhf_mcore.kernels, never as `kernels`: a wheel installs it as rlhf_mcore/kernels/,
    # and rlhf_mcore/kernels.py points the import name at that folder (or at kernels/ in a source tree)
    packages=find_packages(include=["rlhf_mcore", "rlhf_mcore.*"]) + ["rlhf_mcore.kernels"],
    package_dir={"rlhf_mcore.kernels": "kernels"},
    python_requires=">=3.11",
    install_requires=[
        "torch>=2.6",
        "megatron-core==0.16.1",
        "psutil",  # megatron dist_checkpointing needs it but does not declare it (hangs without it)
        "pyyaml",
        "numpy",
        "sentencepiece",
        "transformers",
        "safetensors",
        "pyarrow",
        "tqdm",
        "tensorboard",
        "gguf",
    ],
    extras_require={
        "gpu": ["transformer-engine", "sglang"],
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "ruff", "accelerate", "matplotlib", "peft"],
        "plot": ["matplotlib"],  # tools/plot_metrics.py
        "wandb": ["wandb"],  # trainer.logger=[..., wandb]
    },
)

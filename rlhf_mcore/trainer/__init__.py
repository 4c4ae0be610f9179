"""The RL loop and what it runs on: `loop` (train, train_step), `phases` (one function per phase of a step),
`run` (the run's state and set-up), `roles` / `losses` (models with optimizers and their loss functions),
`schedule` (micro-batches through megatron's schedule), `scoring`, `validation`, `guards` (exit codes).

Kept empty on purpose: importing one of these modules does not import the whole trainer.
"""

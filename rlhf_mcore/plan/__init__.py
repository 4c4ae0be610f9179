"""The memory plan (issue 42): what each rank holds in each RL phase, before launch. `params`: parameters per rank
at a TP x PP x EP layout, exact against the built model."""

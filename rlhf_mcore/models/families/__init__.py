"""One module per model family, each defining `SPEC` (a `models.spec.ModelSpec`); `models.registry` lists them."""

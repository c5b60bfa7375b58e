"""`smollab sweep`: the spec (`spec`, `spec_load`), the Optuna study (`study`), the trials and
results.csv (`trials`), the process scheduler (`scheduler`) and `concurrency: auto`."""

"""`smollab sweep`: the spec (`spec`, `spec_load`; the swept command's keys and metrics in
`command_names`), the Optuna study (`study`), the trials and results.csv (`trials`), the process
scheduler (`scheduler`), what the trials run on (`resources`) and `concurrency: auto`."""

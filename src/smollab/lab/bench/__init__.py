"""`smollab bench`: each performance knob switched on alone, measured on the user's workload. The
order of variants (`run`), the knobs and the plan (`knobs`), one variant's child process and
figures (`measure`), bench.md and bench.png (`report`)."""

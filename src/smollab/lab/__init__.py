"""The lab: sweeps (Optuna ask/tell over child `smollab` processes), probes and the bench.

Nothing here imports a training loop: the lab launches processes and reads run directories.
"""

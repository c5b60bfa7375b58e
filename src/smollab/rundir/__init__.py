"""The run directory as a contract: what a run writes and what sweeps, probes, reports and users
may read, while it runs and after. Imports no torch at import time and no loop.

- `runs`    every file name, the statuses, the default directory name, the read-only `RunView`
- `writer`  `RunDir`, a run's one writer: resume or refuse, log, summary, checkpoints
- `rows`    metrics.csv and samples.jsonl rows: appended live, cut back on resume
- `atomic`  writes that never leave half a file (temp, fsync, rename, fsync the directory)
- `metric`  a sweep's objective (metric, goal, step, reduction), shared by the lab and reports
- `inbox`   the files a sweep and a lanes worker exchange (trial, stop, exit, close)
"""

"""`smollab probe`: how many copies of a workload a device runs at once. The recipe (`spec`), the
doubling and its optima (`run`, `levels`), one level of real processes (`measure`), the cache
(`cache`) and the table and plot (`report`)."""

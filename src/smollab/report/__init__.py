"""Plots and markdown reports, read from run and sweep directories (never from live objects)."""

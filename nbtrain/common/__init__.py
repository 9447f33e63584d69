"""Small helpers every process imports and that import no process's package: words, pids, process trees, leftovers."""

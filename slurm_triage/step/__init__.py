"""What runs around a job step: the gang gate before it, the sampling window of an opted-in
job's Prolog, the in-step watcher and its hang detectors, and the helper the SPANK plugin execs."""

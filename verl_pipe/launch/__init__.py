"""Starting and stopping a run: the TaskRunner actor, the in-process session of tests and benchmarks, start-up checks,
the GPU driver check, the stop request and the teardown that leaves no process behind."""

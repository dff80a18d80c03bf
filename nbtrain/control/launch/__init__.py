"""Starting and stopping processes: the spawner, the warm process, notebook_launcher, SLURM, trackers."""

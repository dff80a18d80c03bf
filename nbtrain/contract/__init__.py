"""The contract between processes: the run-directory format and its records, errors, objectives and data
formats. Standard library only: every process (kernel, server, training rank, job) imports it."""

__version__ = "0.1.0"

"""The rules a run config is checked by beyond its types, one file per concern: secrets, the model, train:
keys, distributed:, the objective and its rewards and hooks, the method, data:, and the planned batch.
Each adds what it finds to one ``Problems`` (config/problems.py), so every problem is in one error."""

"""Sweeps: many runs of one config that vary some of its keys, chosen by Optuna and judged by a metric.

A sweep is a folder (``folder.py``: ``<runs root>/sweeps/<id>/``) and one detached driver process
(``driver.py``, ``python -m nbtrain.control.sweep.driver DIR``) that asks Optuna's study (SQLite, in the
folder) for trials, starts each as an ordinary run (``prepare`` then ``start``: its own run directory,
warm-started, listed and resumable like any run), reports their evaluations to Optuna's pruner and stops
the bad ones, and writes what every reader shows (``trials.json``). The kernel's side (``sweep.py``:
``start_sweep`` and the ``Sweep`` handle) checks the config, decides how many trials run at once
(``capacity.py``), writes the folder and starts the driver; stop, clone and extend are requests in the
folder the driver carries out. The kernel can die: the driver goes on; the driver can die: ``resume``
starts it again and it adopts the trials' runs where they are, re-running none that finished.
"""

"""Instructor mode: a lab preset (``nbtrain.lab.yaml``) that a course ships beside its notebooks.

    # nbtrain.lab.yaml                      found in the working directory or any folder above it,
    course: Fine-tuning 101, lab 3          # or at the path in $NBTRAIN_PRESET
    models: [./tiny-llama, "Qwen/Qwen2.5-*"]   # globs; relative paths are relative to this file
    methods: [lora, qlora]
    objectives: [sft, dpo]
    strategies: [none]
    max_steps: 200                          # a cap: a config without max_steps gets it
    max_train_examples: 20000               # a compute cap: effective batch x max_steps + eval rows
    max_nodes: 1                            # caps on distributed: nodes, and processes in all
    max_processes: 2
    max_memory_gb: 16                       # per device, against the memory estimate (GiB, as it prints)
    seed: 42                                # fixed: a config without train: seed gets it
    data: {train: data/pref.jsonl}          # fixed: a config without data: (or one of its keys) gets it
    trust_remote_code: false                # the default: a model's own Python code never runs
    hooks: [compute_metrics]                # hooks: keys students may use (none unless listed)
    required: true                          # the rules follow the student out of this folder
    slurm: {partition: class, qos: students, account: fin101, time: "00:30:00"}   # every run on the cluster
    max_gpus: 1                             # per run: slurm gpus_per_node x nodes
    max_time: "01:00:00"                    # per run: its slurm time limit (SLURM's formats)
    max_runs_at_once: 1                     # a student's runs queued or running on the cluster at once
    sbatch_allowed: [gres]                  # sbatch options slurm: extra: may set though they bear on the
                                            # rules above (none unless listed)

Every rule is optional. A config outside a rule is refused by ``nbtrain.prepare`` (so by ``%%finetune``,
the CLI and the panel) before anything is written, with one ConfigError listing every violation: the
rule, the preset file, the value the config has and the values the rule allows. Values the preset fixes
and the config leaves out are filled in, and ``resolved.json`` records them. ``nbtrain resume`` checks
the rules again against the train args the run will use (its ``resolved.json``).

Model globs match whole path parts (``*`` never crosses a ``/``), against the model as written with
``.`` and ``..`` normalised away, and against the folder it names; a Hub id never holds ``..``.

``required: true`` makes the course stick: once nbtrain has seen the preset it is remembered (in
``$NBTRAIN_HOME/courses.json``), and its rules apply wherever the student works, also beside another
preset or an empty ``$NBTRAIN_PRESET``. If its file disappears, nothing starts until it is back or the
student leaves the course on purpose (``leave_course``); an instructor who drops ``required`` releases it.

``slurm:`` routes every run of the course to SLURM: a config without ``distributed: slurm:`` gets these
settings, and one that names another partition, account or QOS is refused (its time, GPUs and the rest it
may set within the caps). Students see their place in the queue in the cell, the list and the sidebar.
``slurm: extra:`` lines are read as sbatch reads them (control/launch/sbatch.py: every spelling, short and
long, abbreviated, several options on one line): under these rules they may not set what the preset fixes
or caps (partition, account, QOS, another cluster, time, or GPUs, nodes, tasks, whole nodes, job arrays
under max_gpus) unless ``sbatch_allowed`` lists the option; a value equal to the fixed one, or a time
within the cap, is no escape and passes. ``max_time`` caps a run's whole time on the cluster: with
``requeue: auto`` each requeue is another job of ``time``, so time x (1 + max_requeues) stays within it
(a config that leaves max_requeues out gets as many as fit).

A preset is a guard rail for a course, not a sandbox: it shapes what the notebook surfaces start; a
student who writes their own training loop is outside it.

The package: ``model.py`` (the rules as typed fields, ``fill``, what the panel shows), ``files.py`` (where
the presets in force come from, the required courses), and the rules, each a function of one shape run by
one collector (``collect.py``) per stage: ``configrules.py`` and ``slurmrules.py`` over what the config
says, ``planrules.py`` over the plan, the train args and the runs on the cluster.
"""

from nbtrain.control.config.preset.collect import Planned, Queued
from nbtrain.control.config.preset.files import (
    courses_file,
    find_preset,
    leave_course,
    load_preset,
    preset_path,
)
from nbtrain.control.config.preset.model import PRESET_ENV, PRESET_FILE, Preset
from nbtrain.control.config.preset.planrules import plan_problems, start_refusal, train_args_problems

__all__ = [
    "PRESET_ENV",
    "PRESET_FILE",
    "Planned",
    "Preset",
    "Queued",
    "courses_file",
    "find_preset",
    "leave_course",
    "load_preset",
    "plan_problems",
    "preset_path",
    "start_refusal",
    "train_args_problems",
]

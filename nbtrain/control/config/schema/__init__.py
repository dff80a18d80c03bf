"""The run config's types (pydantic models): ``RunConfig``, its sections and ``Resolved``. Only types and
the checks of one value live here; the rules that look at several keys or at the world are in
``nbtrain.control.config.rules``, and ``nbtrain.control.config.load`` runs both."""

from nbtrain.control.config.schema.run import Resolved, RunConfig
from nbtrain.control.config.schema.sections import (
    NAME_RE,
    STOPPING_STRATEGIES,
    DataSettings,
    DataSourceSettings,
    DistributedSettings,
    HooksSettings,
    LoraSettings,
    QuantSettings,
    RewardModelRef,
    SlurmSettings,
    Strict,
    SweepSettings,
    VisionSettings,
)

__all__ = [
    "NAME_RE",
    "STOPPING_STRATEGIES",
    "DataSettings",
    "DataSourceSettings",
    "DistributedSettings",
    "HooksSettings",
    "LoraSettings",
    "QuantSettings",
    "Resolved",
    "RewardModelRef",
    "RunConfig",
    "SlurmSettings",
    "Strict",
    "SweepSettings",
    "VisionSettings",
]

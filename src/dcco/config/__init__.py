"""The run configuration: frozen dataclasses nested into one ``RunConfig``, loaded from TOML.

Every section is the narrow config of one module (``data``, ``model``, ``augment``, ``loss``,
``train``, ``optim``, ``eval``), with the paper's values as defaults. Loading checks every key
against the field names and types: an unknown key or a bad value is a ``ConfigError`` that names
the key and says what is allowed. Optional fields take the string ``"none"``.
"""

from __future__ import annotations

from dcco.config.runconfig import RunConfig
from dcco.config.sections import (
    CLIENT_DATASETS,
    TENSORBOARD_HINT,
    ConfigError,
    DataConfig,
    DatasetName,
    TrainConfig,
    local_sgd,
    tensorboard_available,
)
from dcco.config.toml import from_dict, load_config, read_toml, to_toml, to_toml_value

__all__ = [
    "CLIENT_DATASETS",
    "TENSORBOARD_HINT",
    "ConfigError",
    "DataConfig",
    "DatasetName",
    "RunConfig",
    "TrainConfig",
    "from_dict",
    "load_config",
    "local_sgd",
    "read_toml",
    "tensorboard_available",
    "to_toml",
    "to_toml_value",
]

"""The run configuration: frozen dataclasses nested into one ``RunConfig``, loaded from TOML.

Every section is the narrow config of one module (``data``, ``model``, ``augment``, ``loss``,
``train``, ``optim``, ``eval``, ``privacy``, ``table``), with the paper's values as defaults.
Loading checks every key against the field names and types: an unknown key or a bad value is a
``ConfigError`` that names the key and says what is allowed. Optional fields take the string
``"none"``.

The config is a leaf: it imports nothing of dcco but ``dcco.errors``, and no torch
(``tests/test_layers.py``). The checks that need a method, a model or the machine are the
run's (``dcco.run.setup.validate``).
"""

from __future__ import annotations

from dcco.config.augment_config import AugmentConfig
from dcco.config.eval_config import EvalConfig
from dcco.config.loss_config import LossConfig
from dcco.config.model_config import ModelConfig
from dcco.config.optim_config import OptimConfig
from dcco.config.privacy_config import PrivacyConfig
from dcco.config.recipes import USER, UserDefaults
from dcco.config.runconfig import RunConfig
from dcco.config.sections import (
    CLIENT_DATASETS,
    METHOD_NAMES,
    PAIRED_DATASETS,
    TENSORBOARD_HINT,
    ConfigError,
    DataConfig,
    DatasetName,
    TrainConfig,
    tensorboard_available,
)
from dcco.config.table_config import TableConfig
from dcco.config.toml import from_dict, load_config, read_toml, to_toml, to_toml_value

__all__ = [
    "CLIENT_DATASETS",
    "METHOD_NAMES",
    "PAIRED_DATASETS",
    "TENSORBOARD_HINT",
    "USER",
    "AugmentConfig",
    "ConfigError",
    "DataConfig",
    "DatasetName",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PrivacyConfig",
    "RunConfig",
    "TableConfig",
    "TrainConfig",
    "UserDefaults",
    "from_dict",
    "load_config",
    "read_toml",
    "tensorboard_available",
    "to_toml",
    "to_toml_value",
]

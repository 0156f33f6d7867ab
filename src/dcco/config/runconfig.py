"""``RunConfig``: every section nested into one run's config, checked across sections where
the settings alone decide (a paired data set's second augmentation, a table's data set,
privacy against cached statistics). The checks that need a method, a model or the machine
(a method against its round settings, its model and its data) are the run's:
``dcco.run.setup.validate``."""

from __future__ import annotations

from dataclasses import dataclass, field

from dcco.config.augment_config import AugmentConfig
from dcco.config.eval_config import EvalConfig
from dcco.config.loss_config import LossConfig
from dcco.config.model_config import ModelConfig
from dcco.config.optim_config import OptimConfig
from dcco.config.privacy_config import PrivacyConfig
from dcco.config.sections import PAIRED_DATASETS, DataConfig, TrainConfig
from dcco.config.table_config import TableConfig, ham10000_table


@dataclass(frozen=True)
class RunConfig:
    """Everything a pretraining run needs, section by section."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    augment_y: AugmentConfig = field(default_factory=AugmentConfig)
    """The second modality's augmentation, for paired data sets (``augment`` is the first's)."""
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    table: TableConfig = field(default_factory=TableConfig)
    """The client table of ``data.dataset = "client_table"`` (its image settings serve
    ``ham10000`` too)."""

    def __post_init__(self) -> None:
        if self.train.absent_statistics == "cached" and self.privacy.enabled:
            raise ValueError("train.absent_statistics = 'cached' keeps each client's own "
                             "statistics at the server, which differential privacy "
                             "forbids; use 'drop' with [privacy]")
        if self.augment_y != AugmentConfig() and self.data.dataset not in PAIRED_DATASETS:
            raise ValueError(f"[augment_y] configures the second modality of paired data; "
                             f"{self.data.dataset} holds images, whose two views both follow "
                             f"[augment]")
        if self.data.dataset == "paired_npz" and self.data.data_dir is None:
            raise ValueError("data.dataset = 'paired_npz' reads train.npz and test.npz from "
                             "data.data_dir; set it (or pass --data-dir)")
        if self.table != TableConfig() and self.data.dataset not in ("client_table",
                                                                     "ham10000"):
            raise ValueError(f"[table] describes a client table (data.dataset = "
                             f"'client_table' or 'ham10000'); {self.data.dataset} is not one")
        if self.data.dataset == "ham10000":
            fixed = ham10000_table(TableConfig())
            clash = [k for k in ("file", "test_file", "image_column", "label_column",
                                 "client_column", "split_column", "image_folders",
                                 "image_suffix")
                     if getattr(self.table, k) != getattr(TableConfig(), k)
                     and getattr(self.table, k) != getattr(fixed, k)]
            if clash:
                raise ValueError(f"data.dataset = 'ham10000' has its own files and columns; "
                                 f"table.{clash[0]} is for data.dataset = 'client_table' "
                                 f"(HAM10000 takes table.image_size, channels, test_fraction "
                                 f"and split_seed)")

"""The named recipes, in one place: which defaults each entry point starts from.

- ``PAPER``: ``RunConfig()``'s defaults, the paper's CIFAR-100 federated pretraining (Adam
  5e-3, a 1024-wide projector, λ = 20): what a config file changes, and what
  ``dcco pretrain`` and ``dcco reproduce`` start from.
- ``USER``: a user's own model: the defaults of ``dcco.fit``, ``dcco.dual_encoder`` and the
  Flower strategy ``dcco.flower.DCCOStrategy``, chosen by measurement (Adam 1e-3 after 10
  warm-up rounds, a 512³ projector, λ = 5; ``UserDefaults``).
- ``DEMO``: ``dcco demo``, sized for 2 CPU cores (the `small` ResNet14, LARS 1.5, 200 rounds of
  32 one-class clients of 4 photos); ``configs/demo_fmnist.toml`` holds it as a file.

``RECIPES`` names them; each entry point says which it uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcco.config.augment_config import AugmentConfig
from dcco.config.eval_config import EvalConfig
from dcco.config.model_config import ModelConfig
from dcco.config.optim_config import OptimConfig
from dcco.config.runconfig import RunConfig
from dcco.config.sections import DataConfig, TrainConfig


@dataclass(frozen=True)
class UserDefaults:
    """The defaults for a user's own model.

    A user's model is not the network a paper recipe was tuned on, so these were chosen by
    measurement on models as users bring them (``experiments/learning_value.py``;
    docs/results/learning-value.md): against the earlier defaults (a projector of
    128³ and the paper's λ = 20), a projector of 512³ and λ = 5 raised the linear probe of
    every model tried, by 0.6 to 4 points at 500 rounds, and no server optimiser beat Adam at
    1e-3."""

    optim: OptimConfig
    """The server optimiser: Adam at 1e-3 (the paper's other rate) after 10 warm-up rounds,
    cosine over the run. Under LARS 1.5 (the Table 1 `small` recipe's, tuned for its ResNet14
    with weight standardisation) a plain CNN with group norm collapses to one direction
    within 20 rounds, and Adam 5e-3 (the paper's CIFAR rate) leaves the paper's own network on
    a plateau for its first ~1,500 rounds; Adam 1e-3 trains both (docs/results/collapse.md)."""
    lambd: float
    """λ of the CCO loss (``loss.lambd``; the paper's, 20, suits its 1024-wide projector)."""
    projector: tuple[int, ...]
    """The projector's widths (dcco's MLP with group norm, paper §4)."""
    clients_per_round: int
    """Clients a round (K)."""


USER = UserDefaults(optim=OptimConfig(optimizer="adam", lr=1e-3, warmup_rounds=10), lambd=5.0,
                    projector=(512, 512, 512), clients_per_round=32)
"""The defaults of ``dcco.fit``, ``dcco.dual_encoder`` and ``dcco.flower.DCCOStrategy``
(``UserDefaults``); docs/config.md prints them ("Defaults for your own model")."""

PAPER = RunConfig()
"""The paper's recipe: every key at its default."""

DEMO = RunConfig(
    data=DataConfig(dataset="fashion_mnist", alpha=0.0, samples_per_client=4),
    model=ModelConfig(arch="resnet14", widths=(16, 32, 64), projector=(128, 128, 128)),
    augment=AugmentConfig(crop_scale=(0.25, 1.0)),
    train=TrainConfig(method="dcco", rounds=200, clients_per_round=32, log_every=10,
                      checkpoint_every=50, knn_every=100),
    optim=OptimConfig(optimizer="lars", lr=1.5, weight_decay=1e-6, warmup_rounds=10),
    eval=EvalConfig(labels=1000, probe_steps=300, probe_batch=256, scratch_epochs=30,
                    knn_bank=5000, knn_queries=1000),
)
"""``dcco demo``'s recipe: a budget for 2 CPU cores (README, "What the main job does")."""

RECIPES: dict[str, RunConfig | UserDefaults] = {"paper": PAPER, "user": USER, "demo": DEMO}
"""Every named recipe; no other set of defaults exists (``tests/test_demo.py``)."""

__all__ = ["DEMO", "PAPER", "RECIPES", "USER", "UserDefaults"]

"""The one place where method names are resolved. Adding a method: a module plus a line here."""

from __future__ import annotations

from dcco.config import LossConfig
from dcco.config.sections import METHOD_NAMES
from dcco.methods.base import Method
from dcco.methods.cco_fedavg import CCOFedAvg
from dcco.methods.centralized_cco import CentralizedCCO
from dcco.methods.clip_fedavg import ClipFedAvg
from dcco.methods.contrastive_fedavg import ContrastiveFedAvg
from dcco.methods.dcco import DCCO
from dcco.methods.divergence import FedEMA, FedU
from dcco.methods.dvicreg import DVICReg
from dcco.methods.fedsc import FedSC, SpectralFedAvg
from dcco.methods.moco import MoCoFedAvg
from dcco.methods.predictive import BYOLFedAvg, CentralizedBYOL, CentralizedSimSiam, SimSiamFedAvg
from dcco.methods.vicreg_fedavg import VICRegFedAvg

METHODS: dict[str, type] = {
    cls.name: cls for cls in (DCCO, CCOFedAvg, ContrastiveFedAvg, CentralizedCCO, DVICReg,
                              VICRegFedAvg, CentralizedBYOL, BYOLFedAvg, CentralizedSimSiam,
                              SimSiamFedAvg, ClipFedAvg, FedSC, SpectralFedAvg, FedU, FedEMA,
                              MoCoFedAvg)
}
if sorted(METHODS) != sorted(METHOD_NAMES):  # pragma: no cover (a method added in one place)
    raise ImportError(f"dcco.config.sections.METHOD_NAMES {sorted(METHOD_NAMES)} must name the "
                      f"registered methods {sorted(METHODS)}")


def build_method(name: str, loss: LossConfig | None = None) -> Method:
    """The method called ``name``, with the given loss hyper-parameters."""
    try:
        cls = METHODS[name]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}"
        ) from None
    return cls(loss or LossConfig())

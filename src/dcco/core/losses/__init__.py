"""Dual-encoder losses, one a file (lightly's layout): CCO (paper eq. 1) from statistics,
NT-Xent, CLIP, MoCo's InfoNCE, VICReg, the spectral contrastive loss, BYOL's and SimSiam's.

Pure functions of tensors. Nothing here communicates: aggregation belongs to the round.
``from dcco.core.losses import cco_loss`` (and every other name) works as it always has.
"""

from dcco.core.losses.byol_loss import byol_loss_per_sample, split_prediction
from dcco.core.losses.cco_loss import (
    cco_from_correlation,
    cco_loss,
    cco_loss_per_segment,
    cross_correlation,
)
from dcco.core.losses.clip_loss import clip_loss, clip_loss_per_anchor
from dcco.core.losses.moco_loss import moco_loss_per_sample
from dcco.core.losses.nt_xent_loss import nt_xent, nt_xent_per_anchor
from dcco.core.losses.simsiam_loss import simsiam_loss_per_sample
from dcco.core.losses.spectral_loss import spectral_loss
from dcco.core.losses.vicreg_loss import VICREG_EPS, VICREG_GAMMA, vicreg_loss

__all__ = ["VICREG_EPS", "VICREG_GAMMA", "byol_loss_per_sample", "cco_from_correlation",
           "cco_loss", "cco_loss_per_segment", "clip_loss", "clip_loss_per_anchor",
           "cross_correlation", "moco_loss_per_sample", "nt_xent", "nt_xent_per_anchor",
           "simsiam_loss_per_sample", "spectral_loss", "split_prediction", "vicreg_loss"]

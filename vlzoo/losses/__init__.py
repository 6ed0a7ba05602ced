"""Contrastive image-text losses (CLIP, SigLIP) and their logit helpers."""

from vlzoo.losses.contrastive import clip_logits
from vlzoo.losses.contrastive import clip_loss
from vlzoo.losses.contrastive import l2_normalize
from vlzoo.losses.contrastive import siglip_logits
from vlzoo.losses.contrastive import siglip_loss
from vlzoo.losses.contrastive import siglip_loss_chunked

__all__ = [
    "clip_logits",
    "clip_loss",
    "l2_normalize",
    "siglip_logits",
    "siglip_loss",
    "siglip_loss_chunked",
]

"""Image-text losses (CLIP, SigLIP, FILIP, FLAIR, SPARC, Llip, STAIR) and their logit helpers."""

from vlzoo.losses.contrastive import clip_logits
from vlzoo.losses.contrastive import clip_loss
from vlzoo.losses.contrastive import l2_normalize
from vlzoo.losses.contrastive import siglip_logits
from vlzoo.losses.contrastive import siglip_loss
from vlzoo.losses.filip import filip_loss
from vlzoo.losses.filip import filip_select_tokens
from vlzoo.losses.flair import flair_caption_indices
from vlzoo.losses.flair import flair_loss
from vlzoo.losses.flair import flair_pair_logits
from vlzoo.losses.late_interaction import filip_ensemble_scores
from vlzoo.losses.late_interaction import filip_similarity
from vlzoo.losses.late_interaction import filip_token_alignment
from vlzoo.losses.llip import llip_attention_weights
from vlzoo.losses.llip import llip_contextualize
from vlzoo.losses.llip import llip_logits
from vlzoo.losses.llip import llip_loss
from vlzoo.losses.llip import llip_template_average
from vlzoo.losses.sparc import sparc_alignment_weights
from vlzoo.losses.sparc import sparc_fine_grained_loss
from vlzoo.losses.sparc import sparc_loss
from vlzoo.losses.stair import flops_regularizer
from vlzoo.losses.stair import flops_weight
from vlzoo.losses.stair import stair_contrastive_loss
from vlzoo.losses.stair import stair_head_pool
from vlzoo.losses.stair import stair_logits
from vlzoo.losses.stair import stair_loss
from vlzoo.losses.stair import stair_pool

__all__ = [
    "filip_ensemble_scores",
    "filip_loss",
    "filip_select_tokens",
    "filip_similarity",
    "filip_token_alignment",
    "flair_caption_indices",
    "flair_loss",
    "flair_pair_logits",
    "llip_attention_weights",
    "llip_contextualize",
    "llip_logits",
    "llip_loss",
    "llip_template_average",
    "sparc_alignment_weights",
    "sparc_fine_grained_loss",
    "sparc_loss",
    "flops_regularizer",
    "flops_weight",
    "stair_contrastive_loss",
    "stair_head_pool",
    "stair_logits",
    "stair_loss",
    "stair_pool",
    "clip_logits",
    "clip_loss",
    "l2_normalize",
    "siglip_logits",
    "siglip_loss",
]

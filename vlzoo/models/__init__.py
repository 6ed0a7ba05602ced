"""Model families."""

from vlzoo.models.base import ContrastiveModel
from vlzoo.models.clip import CLIP
from vlzoo.models.siglip import SigLIP

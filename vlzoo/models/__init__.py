"""Model families."""

from vlzoo.models.base import ContrastiveModel
from vlzoo.models.clip import CLIP
from vlzoo.models.filip import FILIP
from vlzoo.models.flair import FLAIR
from vlzoo.models.llip import Llip
from vlzoo.models.siglip import SigLIP
from vlzoo.models.sparc import SPARC
from vlzoo.models.sparo import SPARO
from vlzoo.models.stair import STAIR

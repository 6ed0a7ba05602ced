"""Model families, and their registry (`vlzoo.families`): every built-in family is registered
once this package is imported, so `registered_families()` read from here lists them all.

Example:
>>> from vlzoo.models import get_family, registered_families
>>> "sparc" in registered_families()
True
"""

from vlzoo.families import CLIPTransfer, Family, get_family, register_family, registered_families  # noqa: F401
from vlzoo.families import transfer_families  # noqa: F401
from vlzoo.models.base import ContrastiveModel
from vlzoo.models.clip import CLIP
from vlzoo.models.filip import FILIP
from vlzoo.models.flair import FLAIR
from vlzoo.models.llip import Llip
from vlzoo.models.pe_core import PECore
from vlzoo.models.siglip import SigLIP
from vlzoo.models.sparc import SPARC
from vlzoo.models.sparo import SPARO
from vlzoo.models.stair import STAIR
from vlzoo.models.tipsv2 import TIPSv2

"""Keras layers of vlzoo, written once in `keras.ops`."""

from vlzoo.layers.embedding import PatchEmbedding, PositionEmbedding, TokenEmbedding, bicubic_resize_matrix
from vlzoo.layers.flair import TextConditionedPooling
from vlzoo.layers.heads import MAPHead
from vlzoo.layers.llip import LlipCrossAttention
from vlzoo.layers.sparo import SPAROReadout
from vlzoo.layers.sparse_vocab import SparseVocabHead
from vlzoo.layers.text import TextTransformer, end_token_index
from vlzoo.layers.transformer import MLP, MultiHeadAttention, TransformerBlock, quick_gelu
from vlzoo.layers.vision import VisionTransformer

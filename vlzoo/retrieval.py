"""Sparse retrieval with vocabulary-sized embeddings (STAIR): top terms, sparsity, an inverted index.

STAIR's embeddings are non-negative `(N, V)` vectors with exact zeros, so a collection can be
served by an inverted index, as a text search engine serves bag-of-words documents (paper
App. D): `to_sparse` / `to_dense` (fixed-shape top-k lists and back), `top_terms` (the heaviest
`(token, weight)` pairs, paper Fig. 4-5), `sparsity_stats`, and `SparseIndex` (postings, top-k
search whose scores are the model's cosines and whose ranking equals the dense one).

Example:
>>> index = SparseIndex(model.embed_dim)  # doctest: +SKIP
>>> index.add(model.encode_image(images)["embeds"])  # doctest: +SKIP
>>> ids, scores = index.search(model.encode_text(["a dog on a beach"])["embeds"], k=5)  # doctest: +SKIP
"""

import json
import os

import numpy as np
from keras import ops

__all__ = ["SparseIndex", "sparsity_stats", "to_dense", "to_sparse", "top_terms"]

# Lower bound on a vector's norm before normalisation (STAIR's cosine guard).
NORM_EPSILON = 1e-6


def _numpy_embeds(embeds, name="embeds"):
    """`(N, V)` float numpy array from a backend tensor or an array."""
    array = np.asarray(ops.convert_to_numpy(embeds))
    if array.ndim != 2:
        raise ValueError(f"`{name}` must have shape (N, V); received shape {array.shape}.")
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"`{name}` must be float; received dtype {array.dtype}.")
    return array


def to_sparse(embeds, top_k=None, min_weight=0.0):
    """The `top_k` heaviest entries of each row, as fixed-shape tensors.

    Args:
        embeds: `(B, V)` non-negative embeddings (any backend, or numpy).
        top_k: entries kept per row `K`; None keeps `V` (all).
        min_weight: entries `<= min_weight` count as absent (weight 0, not
            counted in `nnz`).

    Returns:
        `(ids, weights, nnz)`: int32 `(B, K)` vocabulary ids by decreasing
        weight, float32 `(B, K)` weights (0 where absent) and int32 `(B,)`
        the number of present entries among the `K`.

    Raises:
        ValueError: `embeds` not of rank 2, or `top_k` outside `[1, V]`.

    Example:
    >>> ids, weights, nnz = to_sparse(np.array([[0.0, 2.0, 0.5]]), top_k=2)
    >>> np.asarray(ids).tolist(), np.asarray(nnz).tolist()
    ([[1, 2]], [2])
    """
    embeds = ops.cast(ops.convert_to_tensor(embeds), "float32")
    if len(embeds.shape) != 2:
        raise ValueError(f"`embeds` must have shape (B, V); received shape {tuple(embeds.shape)}.")
    k = embeds.shape[1] if top_k is None else int(top_k)
    if not 1 <= k <= embeds.shape[1]:
        raise ValueError(f"`top_k` must lie in [1, V={embeds.shape[1]}] or be None; received {top_k!r}.")
    weights, ids = ops.top_k(embeds, k)
    present = ops.greater(weights, min_weight)
    weights = ops.where(present, weights, 0.0)
    return ops.cast(ids, "int32"), weights, ops.sum(ops.cast(present, "int32"), axis=1)


def to_dense(ids, weights, vocabulary_size):
    """Inverse of `to_sparse`: `(B, K)` ids and weights -> `(B, V)` float32 (absent entries 0).

    Example:
    >>> np.asarray(to_dense(np.array([[1, 2]]), np.array([[2.0, 0.5]]), 4)).tolist()
    [[0.0, 2.0, 0.5, 0.0]]
    """
    ids = ops.cast(ops.convert_to_tensor(ids), "int32")
    weights = ops.cast(ops.convert_to_tensor(weights), "float32")
    batch, k = ops.shape(ids)[0], ops.shape(ids)[1]
    rows = ops.broadcast_to(ops.arange(batch, dtype="int32")[:, None], (batch, k))
    indices = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(ids, (-1,))], axis=1)
    return ops.scatter(indices, ops.reshape(weights, (-1,)), (batch, vocabulary_size))


def top_terms(embeds, k=20, tokenizer=None):
    """The `k` heaviest non-zero terms of each row, `[(token, weight), ...]` by decreasing weight.

    Args:
        embeds: `(B, V)` non-negative embeddings.
        k: terms per row (fewer when a row has fewer non-zero entries).
        tokenizer: maps ids to strings with `id_to_token`; None (or an object
            without `id_to_token`, such as the stand-in tokenizer of a model
            built without one) gives the int ids.

    Returns:
        A list of `B` lists of `(token, float weight)`.

    Raises:
        ValueError: `embeds` not of rank 2, or `k` outside `[1, V]`.

    Example:
    >>> top_terms(np.array([[0.0, 2.0, 0.5]]), k=3)
    [[(1, 2.0), (2, 0.5)]]
    """
    ids, weights, nnz = (np.asarray(ops.convert_to_numpy(x)) for x in to_sparse(embeds, top_k=k))
    name = getattr(tokenizer, "id_to_token", None)
    return [
        [(name(i) if name is not None else int(i), float(w)) for i, w in zip(row_ids[:n], row_weights[:n])]
        for row_ids, row_weights, n in zip(ids, weights, nnz)
    ]


def sparsity_stats(embeds, queries=None):
    """Sparsity statistics of a set of sparse vectors.

    Args:
        embeds: `(N, V)` embeddings (e.g. the documents).
        queries: optional `(M, V)` embeddings the FLOPs are measured against;
            None measures `embeds` against itself.

    Returns:
        dict with `active_mean`, `active_median`, `active_p90`, `active_min`,
        `active_max` (active = non-zero terms per vector, the paper's
        sparsity measure), `sparsity` (`1 - active_mean / V`), `flops`
        (`sum_k pq_k * pd_k`, the expected number of active terms a query
        and a document share, `p_k` the fraction of vectors with term `k`
        active) and `document_frequency` (int `(V,)`, vectors per term).

    Raises:
        ValueError, TypeError: `embeds` or `queries` not a float `(N, V)` array.

    Example:
    >>> sparsity_stats(np.array([[0.0, 1.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0]]))["sparsity"]
    0.625
    """
    docs = _numpy_embeds(embeds) > 0
    active = docs.sum(axis=1)
    doc_rate = docs.mean(axis=0)
    query_rate = doc_rate if queries is None else (_numpy_embeds(queries, "queries") > 0).mean(axis=0)
    return {
        "active_mean": float(active.mean()),
        "active_median": float(np.median(active)),
        "active_p90": float(np.percentile(active, 90)),
        "active_min": int(active.min()),
        "active_max": int(active.max()),
        "sparsity": float(1.0 - active.mean() / docs.shape[1]),
        "flops": float(np.sum(query_rate * doc_rate)),
        "document_frequency": docs.sum(axis=0),
    }


def _npz_path(path):
    path = os.fspath(path)
    return path if path.endswith(".npz") else path + ".npz"


def _normalize(array):
    norms = np.sqrt(np.sum(np.square(array.astype(np.float64)), axis=1, keepdims=True))
    return array / np.maximum(norms, NORM_EPSILON)


class SparseIndex:
    """An inverted index over non-negative sparse vectors, ranked by the sparse dot product.

    Each added vector is L2-normalised (norm floored at `1e-6`) and stored as
    postings: for every vocabulary id, the documents where it is non-zero
    and their weights. `search` normalises the queries too, adds up
    `q_k * d_k` over the query's terms only, and returns the `k` best
    documents, so scores equal the cosine `normalize(q) . normalize(d)` and
    the ranking equals brute-force dense scoring (ties go to the lower id).
    Work per query grows with the postings of its terms, not with `N * V`.

    Args:
        vocabulary_size: `V`.

    Raises:
        ValueError: `vocabulary_size` not a positive int.

    Example:
    >>> index = SparseIndex(4).add(np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]), ids=[10, 11])
    >>> ids, scores = index.search(np.array([[0.0, 0.0, 1.0, 0.0]]), k=1)
    >>> ids.tolist(), [round(float(x), 4) for x in scores[0]]
    ([[11]], [0.7071])
    >>> index.save("gallery.npz"); SparseIndex.load("gallery.npz")  # doctest: +SKIP
    """

    def __init__(self, vocabulary_size):
        if not isinstance(vocabulary_size, (int, np.integer)) or vocabulary_size < 1:
            raise ValueError(f"`vocabulary_size` must be a positive int; received {vocabulary_size!r}.")
        self.vocabulary_size = int(vocabulary_size)
        self.ids = np.zeros((0,), np.int64)  # external id of each document, by position
        # Postings in CSC layout: the documents of term t are doc_index[offsets[t]:offsets[t + 1]].
        self.offsets = np.zeros((self.vocabulary_size + 1,), np.int64)
        self.doc_index = np.zeros((0,), np.int64)
        self.weights = np.zeros((0,), np.float32)

    def __len__(self):
        return int(self.ids.size)

    def add(self, embeds, ids=None):
        """Adds `(N, V)` non-negative embeddings; `ids`: `N` int ids (default: positions `len(self)...`).

        Returns `self`. Raises ValueError for embeddings not `(N, V)` or negative, or `ids` not one
        per row (TypeError for non-float embeddings)."""
        docs = _numpy_embeds(embeds)
        if docs.shape[1] != self.vocabulary_size:
            raise ValueError(
                f"`embeds` must have shape (N, {self.vocabulary_size}); received shape {docs.shape}."
            )
        if (docs < 0).any():
            raise ValueError("`embeds` must be non-negative (STAIR's sparse vectors are).")
        start = len(self)
        ids = np.arange(start, start + len(docs)) if ids is None else np.asarray(ids, np.int64).reshape(-1)
        if ids.shape != (len(docs),):
            raise ValueError(f"`ids` must hold one id per row ({len(docs)}); received {ids.shape[0]}.")
        rows, terms = np.nonzero(docs)
        values = _normalize(docs)[rows, terms].astype(np.float32)
        old_terms = np.repeat(np.arange(self.vocabulary_size), np.diff(self.offsets))
        terms = np.concatenate([old_terms, terms])
        # A stable sort by term keeps each posting list in document order.
        order = np.argsort(terms, kind="stable")
        self.doc_index = np.concatenate([self.doc_index, rows + start])[order]
        self.weights = np.concatenate([self.weights, values])[order]
        self.offsets = np.concatenate([[0], np.cumsum(np.bincount(terms, minlength=self.vocabulary_size))])
        self.ids = np.concatenate([self.ids, ids])
        return self

    def scores(self, queries, query_terms=None):
        """Cosine of every query with every document, `(M, N)` float64, from the postings.

        `query_terms`: keep only each query's `query_terms` heaviest terms
        (query pruning, App. D; the kept weights are those of the whole
        normalised query); None keeps all. Raises as `add` for queries not `(M, V)`.
        """
        queries = _normalize(_numpy_embeds(queries, "queries"))
        if queries.shape[1] != self.vocabulary_size:
            raise ValueError(
                f"`queries` must have shape (M, {self.vocabulary_size}); received shape {queries.shape}."
            )
        out = np.zeros((len(queries), len(self)), np.float64)
        for row, query in zip(out, queries):
            terms = np.flatnonzero(query)
            if query_terms is not None:
                terms = terms[np.argsort(-query[terms], kind="stable")[:query_terms]]
            starts, ends = self.offsets[terms], self.offsets[terms + 1]
            lengths = ends - starts
            positions = np.repeat(ends - np.cumsum(lengths), lengths) + np.arange(lengths.sum())
            row += np.bincount(self.doc_index[positions], weights=np.repeat(query[terms], lengths)
                               * self.weights[positions], minlength=len(self))
        return out

    def search(self, queries, k=10, query_terms=None):
        """The `k` best documents of each query.

        Args:
            queries: `(M, V)` non-negative embeddings (unnormalised is fine).
            k: results per query (at most `len(self)`).
            query_terms: prune each query to its heaviest terms (see `scores`).

        Returns:
            `(ids, scores)`: int64 `(M, k')` document ids and float32 `(M, k')`
            cosines by decreasing score, `k' = min(k, len(self))`.
        """
        scores = self.scores(queries, query_terms)
        k = min(int(k), len(self))
        # Sort by decreasing score, then increasing position (deterministic ties).
        order = np.lexsort((np.broadcast_to(np.arange(len(self)), scores.shape), -scores), axis=1)[:, :k]
        return self.ids[order], np.take_along_axis(scores, order, axis=1).astype(np.float32)

    def stats(self):
        """`sparsity_stats`-style numbers of the indexed documents: active terms per document and postings."""
        active = np.bincount(self.doc_index, minlength=len(self))
        frequency = np.diff(self.offsets)
        return {
            "documents": len(self),
            "postings": int(self.doc_index.size),
            "active_mean": float(active.mean()) if len(self) else 0.0,
            "active_median": float(np.median(active)) if len(self) else 0.0,
            "active_max": int(active.max()) if len(self) else 0,
            "terms_used": int(np.count_nonzero(frequency)),
            "document_frequency": frequency,
        }

    def save(self, path):
        """Writes the index to one `.npz` file; returns its path (`.npz` appended when missing)."""
        path = _npz_path(path)
        header = json.dumps({"format": "vlzoo.SparseIndex", "version": 1, "vocabulary_size": self.vocabulary_size})
        np.savez(path, header=np.asarray(header), ids=self.ids, offsets=self.offsets,
                 doc_index=self.doc_index, weights=self.weights)
        return path

    @classmethod
    def load(cls, path):
        """Reads an index written by `save`; FileNotFoundError if `path` is missing, ValueError if it
        is not a `SparseIndex` file."""
        path = _npz_path(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Sparse index file not found: {path!r}.")
        with np.load(path) as data:
            header = json.loads(str(data["header"]))
            if header.get("format") != "vlzoo.SparseIndex":
                raise ValueError(f"{path!r} is not a vlzoo SparseIndex file.")
            index = cls(header["vocabulary_size"])
            for name in ("ids", "offsets", "doc_index", "weights"):
                setattr(index, name, data[name])
        return index

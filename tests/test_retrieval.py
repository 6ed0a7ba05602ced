"""Sparse retrieval: top-k lists, top terms, sparsity statistics and the inverted index against dense scoring."""

import numpy as np
import pytest
from conftest import to_numpy

from vlzoo import retrieval
from vlzoo.losses.stair import stair_logits


def sparse_collection(n, vocabulary_size=64, density=0.15, seed=0):
    rng = np.random.default_rng(seed)
    values = np.abs(rng.normal(size=(n, vocabulary_size))) * (rng.random((n, vocabulary_size)) < density)
    return values.astype("float32")


def test_to_sparse_and_back_is_exact():
    x = np.array([[0.0, 3.0, 0.5, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.1, 0.0]], "float32")
    ids, weights, nnz = (to_numpy(t) for t in retrieval.to_sparse(x))
    assert ids.shape == (3, 5) and ids.dtype == np.int32
    np.testing.assert_array_equal(nnz, [3, 0, 2])
    np.testing.assert_array_equal(ids[0, :3], [1, 4, 2])
    np.testing.assert_array_equal(weights[0], [3.0, 1.0, 0.5, 0.0, 0.0])
    np.testing.assert_array_equal(to_numpy(retrieval.to_dense(ids, weights, 5)), x)
    ids, weights, nnz = (to_numpy(t) for t in retrieval.to_sparse(x, top_k=2, min_weight=0.2))
    np.testing.assert_array_equal(nnz, [2, 0, 1])
    np.testing.assert_array_equal(weights, [[3.0, 1.0], [0.0, 0.0], [2.0, 0.0]])
    pruned = to_numpy(retrieval.to_dense(ids, weights, 5))
    np.testing.assert_array_equal(pruned, [[0, 3, 0, 0, 1], [0, 0, 0, 0, 0], [2, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="top_k"):
        retrieval.to_sparse(x, top_k=6)
    with pytest.raises(ValueError, match="embeds"):
        retrieval.to_sparse(np.zeros(5))


def test_top_terms_are_sorted_and_named():
    class Vocabulary:
        def id_to_token(self, i):
            return f"w{i}"

    x = np.array([[0.0, 3.0, 0.5, 0.0, 1.0], [0.0, 0.0, 0.2, 0.0, 0.0]], "float32")
    terms = retrieval.top_terms(x, k=2, tokenizer=Vocabulary())
    assert terms == [[("w1", 3.0), ("w4", 1.0)], [("w2", pytest.approx(0.2))]]
    assert retrieval.top_terms(x, k=5)[0] == [(1, 3.0), (4, 1.0), (2, 0.5)]


def test_sparsity_stats_by_hand():
    x = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0], [0.0, 1.0, 1.0, 3.0]], "float32")
    stats = retrieval.sparsity_stats(x)
    assert (stats["active_mean"], stats["active_median"], stats["active_min"], stats["active_max"]) == (2.0, 2.0, 1, 3)
    assert stats["sparsity"] == pytest.approx(0.5)
    np.testing.assert_array_equal(stats["document_frequency"], [2, 2, 1, 1])
    # FLOPs = sum_k p_k^2 = (2/3)^2 * 2 + (1/3)^2 * 2 = 10/9; against other queries sum_k pq_k pd_k.
    assert stats["flops"] == pytest.approx(10 / 9)
    queries = np.array([[1.0, 0.0, 0.0, 0.0]], "float32")
    assert retrieval.sparsity_stats(x, queries)["flops"] == pytest.approx(2 / 3)


def test_index_ranks_exactly_as_dense_scoring():
    docs = sparse_collection(300, seed=1)
    docs[7] = 0.0  # an empty document scores 0 everywhere
    queries = sparse_collection(25, seed=2)
    index = retrieval.SparseIndex(64).add(docs[:120]).add(docs[120:])  # two batches
    dense = to_numpy(stair_logits(queries, docs, 1.0))  # the model's (unscaled) score
    # The dense float32 scores (a few products of normalised vectors each) are within 6 ulps of the index's float64
    # ones: distinct scores 16 ulps apart keep their order in both; the equal ones are the zeros, exact in both.
    assert (np.abs(index.scores(queries) - dense) <= 6 * np.spacing(np.abs(dense))).all()
    ordered = np.sort(dense, axis=1)
    gaps, upper = np.diff(ordered, axis=1), ordered[:, 1:]
    assert (upper[gaps == 0] == 0).all() and (gaps[gaps > 0] >= 16 * np.spacing(np.abs(upper[gaps > 0]))).all()
    ids, scores = index.search(queries, k=10)
    assert ids.shape == (25, 10) and scores.dtype == np.float32
    np.testing.assert_array_equal(ids, np.argsort(-dense, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(scores, np.take_along_axis(dense, ids, axis=1), atol=1e-6)
    np.testing.assert_allclose(index.scores(queries), dense, atol=1e-6)
    # Full ranking, zero scores included, and the empty document.
    ids, _ = index.search(queries, k=1000)
    np.testing.assert_array_equal(ids, np.argsort(-dense, axis=1, kind="stable"))
    # Query pruning: to at least every query's active terms changes nothing; to one term keeps its product.
    most = int((queries > 0).sum(1).max())
    np.testing.assert_allclose(index.scores(queries, query_terms=most), index.scores(queries), atol=1e-12)
    top = np.argmax(queries, axis=1)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    d = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), 1e-6)
    np.testing.assert_allclose(index.scores(queries, query_terms=1), q[np.arange(25), top][:, None] * d[:, top].T,
                               atol=1e-6)
    stats = index.stats()
    assert stats["documents"] == 300 and stats["postings"] == int((docs > 0).sum())
    assert stats["active_mean"] == pytest.approx(float((docs > 0).sum(1).mean()))


def test_index_ties_ids_and_persistence(tmp_path):
    docs = sparse_collection(20, seed=3)
    docs[5] = docs[11]  # identical documents tie: the lower position ranks first
    index = retrieval.SparseIndex(64)
    index.add(docs, ids=np.arange(100, 120))
    ids, scores = index.search(docs[11:12], k=3)
    assert ids[0, :2].tolist() == [105, 111] and scores[0, 0] == scores[0, 1] == pytest.approx(1.0)
    path = index.save(tmp_path / "gallery")
    assert path.endswith(".npz")
    loaded = retrieval.SparseIndex.load(tmp_path / "gallery")
    assert len(loaded) == 20 and loaded.vocabulary_size == 64
    for a, b in zip(loaded.search(docs, k=5), index.search(docs, k=5)):
        np.testing.assert_array_equal(a, b)


def test_index_input_errors(tmp_path):
    index = retrieval.SparseIndex(8)
    with pytest.raises(ValueError, match="non-negative"):
        index.add(-np.ones((2, 8), "float32"))
    with pytest.raises(ValueError, match=r"\(N, 8\)"):
        index.add(np.ones((2, 9), "float32"))
    with pytest.raises(ValueError, match="ids"):
        index.add(np.ones((2, 8), "float32"), ids=[1])
    with pytest.raises(ValueError, match="queries"):
        index.add(np.ones((2, 8), "float32")).search(np.ones((1, 7), "float32"))
    with pytest.raises(ValueError, match="vocabulary_size"):
        retrieval.SparseIndex(0)
    with pytest.raises(FileNotFoundError):
        retrieval.SparseIndex.load(tmp_path / "missing.npz")

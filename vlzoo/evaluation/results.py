"""Benchmark results in clip_benchmark's result schema, and as a Markdown table.

clip_benchmark (LAION-AI/CLIP_benchmark) writes one JSON object per dataset:
`{"dataset", "model", "pretrained", "task", "metrics", "language"}`; vlzoo's
records carry the same keys (`model` is the preset, `pretrained` its weights'
source or None), plus `groups` (the metrics per group of items) where the
benchmark has groups and `dtype` (the towers' dtype policy) where given. `markdown_table` lays
records out one row per dataset.

Example:
>>> record = benchmark_record(evaluate_selection(model, winoground(data)), "clip_vit_b16_openai")  # doctest: +SKIP
>>> print(markdown_table([record]))  # doctest: +SKIP
| dataset | model | text | image | group |
...
"""

__all__ = ["benchmark_record", "markdown_table"]


def benchmark_record(result, model, pretrained=None, language="en", dtype=None):
    """A result of `vlzoo.evaluation` (`dataset`, `task`, `metrics`, optional `groups`) as a record
    in clip_benchmark's schema; `dtype` (e.g. `"bfloat16"`) is recorded when given.

    >>> benchmark_record({"dataset": "cifar10", "task": "zeroshot_classification",
    ...                   "metrics": {"acc1": 0.9}}, "clip_shapes")["model"]
    'clip_shapes'
    """
    record = {"dataset": result["dataset"], "model": str(model), "pretrained": pretrained, "task": result["task"],
              "metrics": dict(result["metrics"]), "language": language}
    if dtype is not None:
        record["dtype"] = str(dtype)
    if result.get("groups"):
        record["groups"] = {name: dict(metrics) for name, metrics in result["groups"].items()}
    return record


def markdown_table(records, digits=4):
    """One row per record: dataset, model and every metric (columns in first-seen order; blank
    where a record lacks one).

    >>> print(markdown_table([{"dataset": "cifar10", "model": "clip_shapes", "metrics": {"acc1": 0.9}}]))
    | dataset | model | acc1 |
    |---|---|---:|
    | cifar10 | clip_shapes | 0.9000 |
    <BLANKLINE>
    """
    metrics = list(dict.fromkeys(name for record in records for name in record["metrics"]))
    rows = ["| dataset | model | " + " | ".join(metrics) + " |", "|---|---|" + "---:|" * len(metrics)]
    for record in records:
        values = [f"{record['metrics'][name]:.{digits}f}" if name in record["metrics"] else "" for name in metrics]
        rows.append(f"| {record['dataset']} | {record['model']} | " + " | ".join(values) + " |")
    return "\n".join(rows) + "\n"

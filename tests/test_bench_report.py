"""tools/bench_report.py renders a bench.json into docs/benchmarks.md's marked section, prose untouched."""

import json
import os
import subprocess
import sys

import pytest
from backend_utils import load_tool, run_once

RESULTS = {
    "machine": "test CPU (avx2)", "date": "2026-11-25 09:00 UTC",
    "rows": [{"entry": "filip_loss", "backend": "jax", "B": 32, "P": 16, "T": 8, "D": 64, "num_chunks": 4,
              "result": {"first_call_s": 1.5, "median_s": 0.25, "peak_mb": 120.0}}],
}


# Renders JSON into Markdown: nothing of a backend, checked in one pass.
pytestmark = run_once


@pytest.fixture
def report():
    return load_tool("bench_report")


def _page(report, body):
    return f"# Title\n\nProse before.\n\n{report.SECTION_BEGIN}\n{body}{report.SECTION_END}\n\n## Records\n\nKept.\n"


def test_only_the_marked_section_is_rewritten(report):
    text = report.render_into(_page(report, "old figures\n"), RESULTS)
    head, rest = text.split(report.SECTION_BEGIN)
    section, tail = rest.split(report.SECTION_END)
    assert head == "# Title\n\nProse before.\n\n" and tail == "\n\n## Records\n\nKept.\n"
    assert "old figures" not in section and section.strip() == report.section(RESULTS).strip()
    assert "2026-11-25 09:00 UTC" in section and "test CPU (avx2)" in section and "| filip_loss | jax |" in section
    assert report.render_into(text, RESULTS) == text  # a second run with the same results changes nothing


def test_a_page_without_the_marks_is_written_whole(report):
    assert report.render_into(None, RESULTS) == report.page(RESULTS)
    assert report.render_into("# Someone's notes\n", RESULTS) == report.page(RESULTS)


def test_from_json_writes_into_the_page(tmp_path, repo_root, report):
    (tmp_path / "bench.json").write_text(json.dumps(RESULTS))
    page = tmp_path / "benchmarks.md"
    page.write_text(_page(report, "old\n"))
    subprocess.run([sys.executable, os.path.join(repo_root, "tools", "bench.py"), "--from-json",
                    str(tmp_path / "bench.json"), "--markdown", str(page)], check=True, capture_output=True)
    assert page.read_text() == report.render_into(_page(report, "old\n"), RESULTS)


def test_an_accelerator_run_goes_to_its_own_section_with_device_memory(report):
    gpu = dict(RESULTS, machine="NVIDIA H100 80GB HBM3 (jax); host: test CPU", accelerators={"jax": "NVIDIA H100"},
               rows=[dict(RESULTS["rows"][0], result=dict(RESULTS["rows"][0]["result"], device_peak_mb=777.0))])
    page = _page(report, "cpu figures\n") + f"{report.GPU_SECTION_BEGIN}\nold gpu\n{report.GPU_SECTION_END}\n"
    text = report.render_into(page, gpu)
    assert text.split(report.GPU_SECTION_BEGIN)[0] == page.split(report.GPU_SECTION_BEGIN)[0]  # the CPU run's stays
    section = text.split(report.GPU_SECTION_BEGIN)[1].split(report.GPU_SECTION_END)[0]
    assert "old gpu" not in section and "NVIDIA H100 80GB HBM3" in section
    # The accelerator's peak, labelled so, in place of the host's (120.0 MB).
    assert "peak accelerator memory (MB)" in section and "| 777.0 |" in section and "120.0" not in section
    # A CPU run (no accelerator found) still writes the CPU section, with the host's peak.
    cpu = report.render_into(text, dict(RESULTS, accelerators={"jax": None}))
    assert "| 120.0 |" in cpu.split(report.SECTION_BEGIN)[1] and cpu.split(report.GPU_SECTION_BEGIN)[1] == \
        text.split(report.GPU_SECTION_BEGIN)[1]

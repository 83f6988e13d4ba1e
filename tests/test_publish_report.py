"""benchmarks/publish_report.py: a report becomes a results page without this machine's paths; a given header
(a simulated report's) replaces the runs' provenance."""
from benchmarks.publish_report import publish


def _report(folder):
    folder.mkdir()
    (folder / "REPORT.md").write_text(f"# batchlab report: {folder.resolve()}\n\nsee {folder}/plot.png\n")
    (folder / "plot.png").write_bytes(b"png")
    return folder


def test_the_page_names_the_folder_not_where_it_lay(tmp_path):
    folder = _report(tmp_path / "gpu-sim")
    page = publish(folder, "page", docs=tmp_path / "docs")
    text = page.read_text()
    assert str(tmp_path) not in text
    assert "# batchlab report: gpu-sim" in text and "see gpu-sim/plot.png" in text
    assert (tmp_path / "docs" / "page" / "plot.png").read_bytes() == b"png"
    assert text.startswith("> Generated from `gpu-sim` by benchmarks/publish_report.py. Machine:")


def test_a_given_header_replaces_the_provenance_and_a_republish_replaces_the_page(tmp_path):
    folder = _report(tmp_path / "sim")
    publish(folder, "page", docs=tmp_path / "docs")
    (tmp_path / "docs" / "page" / "stale.png").write_bytes(b"old")
    page = publish(folder, "page", header="**Simulated, not measured.**", docs=tmp_path / "docs")
    assert page.read_text().startswith("> **Simulated, not measured.**\n\n# batchlab report: sim")
    assert not (tmp_path / "docs" / "page" / "stale.png").exists()

"""The README's and docs' marked benchmark tables match the JSONs in docs/bench they quote
(lab/verl_pipe_lab/bench/readme_tables.py); a table that drifts from its JSON fails here. The README keeps one headline table;
the measurements it carried until 2026-12-05 are in docs/results.md."""

import re

import pytest

from verl_pipe_lab.bench import readme_tables as rt

README = rt.ROOT / "README.md"
RESULTS = rt.ROOT / "docs" / "results.md"
HEADLINE = ("docs/bench/bench_paper_tiny_coalesced_2026-12-01.json", "paper_vs_peer")


def test_every_marked_table_matches_its_json():
    files = rt.markdown_files()
    assert README in files and RESULTS in files
    problems = [p for f in files for p in rt.check_text(f.read_text(), str(f.relative_to(rt.ROOT)))]
    assert problems == [], "\n" + "\n".join(problems) + "\n(python -m verl_pipe_lab.bench.readme_tables --write)"


def test_the_readme_benchmark_tables_are_marked():
    # a marker dropped from the README or docs/results.md would leave its table unchecked
    assert {(b["path"], b["kind"]) for b in rt.blocks(README.read_text())} == {HEADLINE}
    marked = {(b["path"], b["kind"]) for b in rt.blocks(RESULTS.read_text())}
    assert marked >= {("docs/bench/bench_2026-11-30.json", "balanced"), ("docs/bench/bench_2026-11-30.json", "paper"),
                      ("docs/bench/bench_paper_tiny_coalesced_2026-12-01.json", "paper_vs_peer"),
                      ("docs/bench/bench_paper_tiny_coalesced_2026-12-01.json", "trainer_costs"),
                      ("docs/bench/bench_queue_2026-12-02.json", "fgd_vs_cgp"),
                      ("docs/bench/bench_paper_tiny_adaptive_2026-12-02.json", "fgd_vs_cgp"),
                      ("docs/bench/bench_queue_rotated_2026-12-02.json", "fgd_vs_cgp"),
                      ("docs/bench/bench_fgd_order_2026-12-02.json", "fgd_vs_cgp"),
                      ("docs/bench/bench_queue_after_cuts_2026-12-02.json", "fgd_vs_cgp"),
                      ("docs/bench/trainer_gap_paper_2026-12-01.json", "trainer_gap")}


def test_a_drifted_figure_is_reported_and_write_restores_it():
    text = RESULTS.read_text()
    assert text.count("| sync | 47.78 s |") == 1
    drifted = text.replace("| sync | 47.78 s |", "| sync | 47.79 s |")
    problems = rt.check_text(drifted, "docs/results.md")
    assert len(problems) == 1 and "bench_2026-11-30.json:balanced" in problems[0] and "47.79" in problems[0]
    assert rt.rewrite_text(drifted) == text
    # a row lost from a table is a difference too
    assert rt.check_text(text.replace("| cgp, group granularity | 34.48 s", "| x", 1), "docs/results.md")


def test_cells_and_markers():
    assert rt.change(26.4) == "\u221226.4%" and rt.change(-10.1) == "+10.1%"
    assert rt.seconds(48.53, 1) == "48.5 s"
    head = "<!-- table: docs/bench/bench_2026-11-30.json:balanced -->"
    with pytest.raises(ValueError, match="without"):
        rt.blocks(f"{head}\n| a |\n")
    bad = rt.check_text("<!-- table: docs/bench/bench_2026-11-30.json:nosuchkind -->\n| a |\n<!-- /table -->", "x.md")
    assert len(bad) == 1 and "unknown table kind" in bad[0]
    missing = rt.check_text("<!-- table: docs/bench/nope.json:paper -->\n<!-- /table -->", "x.md")
    assert "cannot render" in missing[0]


def test_cli_check_exits_1_on_a_mismatch(tmp_path, capsys):
    md = tmp_path / "t.md"
    md.write_text("<!-- table: docs/bench/bench_2026-11-30.json:paper -->\n| stale |\n<!-- /table -->\n")
    assert rt.main(["--check", str(md)]) == 1
    assert "differs from its JSON" in capsys.readouterr().err
    assert rt.main(["--write", str(md)]) == 0
    assert rt.main(["--check", str(md)]) == 0
    assert "| sync | 64.25 s |" in md.read_text()


@pytest.mark.parametrize("doc", [README, RESULTS], ids=["README.md", "docs/results.md"])
def test_every_readme_table_with_measured_figures_is_marked(doc):
    # The README's and docs/results.md's tables match their JSONs. A table of timings or percentages outside a marker
    # would be checked by nothing; config and key tables (no "N s" or "N%") need no marker.
    figure = re.compile(r"\d(?:[\d.,]*)\s?(?:s|%)(?:\W|$)")
    unmarked, inside, table = [], False, []
    for line in doc.read_text().splitlines() + [""]:
        if rt.MARKER.match(line):
            inside = True
        elif line.strip() == rt.END:
            inside = False
        if line.startswith("|") and not inside:
            table.append(line)
            continue
        # docs/results.md's study index (header "| study |"): one line per registered study, each naming the JSON its
        # figures are read from; the figures the README and the lead rely on are recomputed by test_readme_figures.py
        index = doc.name == "results.md" and table and table[0].startswith("| study |")
        if table and not index and any(figure.search(row) for row in table[2:]):
            unmarked.append(table[0])
        table = []
    assert unmarked == [], f"{doc.name}: tables with figures but no `<!-- table: ... -->` marker: {unmarked}"

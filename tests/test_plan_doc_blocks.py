"""The planner's three generated blocks are what their commands print today: the validation block in
docs/plan_validation.md (``python -m verl_pipe.plan --validate --update-doc docs/plan_validation.md``, over the bench
JSONs in docs/bench), and in docs/plan_public.md the public-figures block (``python -m verl_pipe.plan.public
--update-doc docs/plan_public.md``) and the GPU picture (``python -m verl_pipe.plan.gpu_picture --update-doc
docs/plan_public.md``: Qwen3-1.7B on 8 H200, padding removed, verl's
colocated default, the orchestration-cost sweep and its break-even). A bench JSON added or changed
without regenerating the block, or a planner change that moves its figures, fails here. The public and GPU blocks' own
running time ("(N s here)") differs run to run, and the validation block's "Skipped:" line names every JSON in
docs/bench that is no bench result (a run still writing its JSON in a shared tree changes it): both are left out of
the comparison."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VALIDATION_DOC = ROOT / "docs" / "plan_validation.md"
PUBLIC_DOC = ROOT / "docs" / "plan_public.md"
RUNTIME = re.compile(r"\(\d+ s here\)")
SKIPPED = re.compile(r"^Skipped: .*$", re.M)


def block(text: str, begin: str, end: str) -> str:
    """The text between the markers, without the newline after ``begin`` and before ``end``."""
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} block")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def differing_lines(doc: str, fresh: str) -> list[str]:
    """The lines of ``doc`` and ``fresh`` that differ, marked '-' (in the doc) and '+' (printed today)."""
    a, b = doc.splitlines(), fresh.splitlines()
    out = [f"- {x}" for x in a if x not in b] + [f"+ {x}" for x in b if x not in a]
    if not out and a != b:
        out = ["(same lines, other order)"]
    return out


def test_the_validation_block_is_current():
    from verl_pipe.plan.validate import BEGIN, END, markdown, validate

    fresh = SKIPPED.sub("Skipped: …", markdown(validate(ROOT / "docs" / "bench")))
    diff = differing_lines(SKIPPED.sub("Skipped: …", block(VALIDATION_DOC.read_text(), BEGIN, END)), fresh)
    assert diff == [], ("docs/plan_validation.md's validation block is stale; regenerate it with "
                        "`python -m verl_pipe.plan --validate --update-doc docs/plan_validation.md`:\n"
                        + "\n".join(diff[:20]))


def test_the_public_block_is_current():
    from verl_pipe.plan.public import BEGIN, END, render

    fresh = RUNTIME.sub("(N s here)", render())
    doc = RUNTIME.sub("(N s here)", block(PUBLIC_DOC.read_text(), BEGIN, END))
    diff = differing_lines(doc, fresh)
    assert diff == [], ("docs/plan_public.md's public-figures block is stale; regenerate it with "
                        "`python -m verl_pipe.plan.public --update-doc docs/plan_public.md`:\n" + "\n".join(diff[:20]))


def test_a_drifted_block_is_told():
    doc = "a\n<!-- b:begin -->\n| x | 1.0% |\n| y | 2 s (3 s here) |\n<!-- b:end -->\nz"
    got = block(doc, "<!-- b:begin -->", "<!-- b:end -->")
    assert got == "| x | 1.0% |\n| y | 2 s (3 s here) |"
    assert differing_lines(got, "| x | 1.1% |\n| y | 2 s (3 s here) |") == ["- | x | 1.0% |", "+ | x | 1.1% |"]
    assert RUNTIME.sub("", "(12 s here)") == ""
    with pytest.raises(ValueError, match="no <!-- c:begin -->"):
        block(doc, "<!-- c:begin -->", "<!-- c:end -->")


def held_out_max(table: str) -> dict[str, float]:
    """Per mode, the larger of the two held-out columns (round, config) of the block's per-mode table, in %."""
    out = {}
    for line in table.split("Per mode", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] not in ("mode", "") and not cells[0].startswith("-"):
            got = [float(c.split("%")[0]) for c in cells[2:4] if c.endswith(")")]
            if got:
                out[cells[0]] = max(got)
    return out


def test_the_results_page_quotes_the_blocks_held_out_errors():
    from verl_pipe.plan.validate import BEGIN, END

    got = held_out_max(block(VALIDATION_DOC.read_text(), BEGIN, END))
    phrase = (f"sync within {got['sync']:.0f}%, group granularity {got['cgp_group']:.0f}%, verl's peer "
              f"{got['verl_separate_async']:.0f}%, but cgp and cgp+fgd miss by up to {got['cgp']:.0f}% and "
              f"{got['cgp_fgd']:.0f}%")
    results = re.sub(r"\s+", " ", (ROOT / "docs" / "results.md").read_text())
    assert phrase in results, f"docs/results.md: expected the planner's held-out errors as the block has them:\n  {phrase}"


def test_the_gpu_picture_block_is_current():
    from verl_pipe.plan.gpu_picture import BEGIN, END, render

    fresh = RUNTIME.sub("(N s here)", render())
    doc = RUNTIME.sub("(N s here)", block(PUBLIC_DOC.read_text(), BEGIN, END))
    diff = differing_lines(doc, fresh)
    assert diff == [], ("docs/plan_public.md's GPU picture block is stale; regenerate it with "
                        "`python -m verl_pipe.plan.gpu_picture --update-doc docs/plan_public.md`:\n" + "\n".join(diff[:20]))

"""``nfc-dps bench report``: the result tables of the documentation, generated from the committed
result files, never typed by hand.

Each page (``PAGES``) holds marker comments::

    <!-- table:local256 -->
    (generated: replaced by every run of the report)
    <!-- /table -->

and :func:`update_pages` rewrites what lies between them from the files under ``docs/``: the grids'
``docs/bench/<name>_results.csv`` (averaged with summary.md's helpers, :mod:`nfc_dps.bench.tables`)
captioned from ``<name>_summary.md``'s header, ``calibration*/calibration.csv``, the Gaussian
oracle's ``oracle*_summary.md``, ``docs/prior_report.json`` and docs/scale.md's JSON files. Each
page of ``PAGE_TABLES`` must hold its tables: a missing or malformed opening or closing marker is
an error naming the page and the table, as are an unknown table name and a malformed row of a
result file (naming the file and its line). Running it twice changes nothing. ``--check`` writes nothing and exits 1
when a page differs from what the result files
give (tests/test_bench_report.py runs it on the repository).

This module holds the pages, their markers and the table each marker names
(:func:`table_builders`); the grids', calibration and oracle tables are built in
:mod:`nfc_dps.bench.report_tables`.

A new prior or preset: ``scripts/rerun_tables.sh`` reruns the protocols and copies their result
files into docs/bench under the names below (docs/benchmarks.md names each command); then run
``nfc-dps bench report`` and commit.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Sequence

from ..io import atomic_write_text
from .blind import blind_doc_table
from .calibration_report import conformal_table
from .jpeg import jpeg_doc_table
from .noise_level import denoise_doc_table, noise_level_doc_table, shot_doc_table
from .nonlinear import nonlinear_doc_table
from .prior_report_markdown import prior_table
from .report_scale import scale_table, throughput_table
from .report_tables import (  # noqa: F401 - oracle_rows and read_header: for callers of this module
    Source,
    _conformal_csv,
    calibration_table,
    cost_table,
    glance_table,
    grid_table,
    load_source,
    oracle_rows,
    oracle_table,
    per_image_table,
    read_header,
    which_table,
)
from .shift_rules import shift_doc_table

MARKER = re.compile(r"(<!-- table:(?P<name>[A-Za-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
#: any opening or closing marker, well-formed or not (:func:`check_markers`)
ANY_MARKER = re.compile(r"<!--\s*(?P<close>/)?\s*table\b\s*:?\s*(?P<name>[^\s>]*?)\s*-->(?P<eol>\n?)")
#: the tables each page must hold (a missing opening or closing marker is an error naming both)
PAGE_TABLES: dict[str, tuple[str, ...]] = {
    "docs/benchmarks.md": ("glance", "local256", "local256_seed1", "paper256", "paper256_per_image", "paper256_cost",
                           "oracle"),
    "docs/benchmarks_64px.md": ("local64", "local_k4_25", "local100", "local_default"),
    "docs/prior.md": ("prior_report",),
    "docs/interval_coverage.md": ("conformal_oracles", "conformal_nfc_fast", "conformal_methods_sr",
                                  "conformal_methods_inpaint_random"),
    "docs/interval_shift.md": ("calibration_shift",),
    "docs/uncertainty.md": ("calibration",),
    "docs/scale.md": ("scale_cpu", "restore_throughput"),
    "docs/nonlinear.md": ("nonlinear64",),
    "docs/noise_level.md": ("noise_level256", "noise_level128", "noise_level_denoise128", "noise_level_shot128"),
    "docs/blind.md": ("blind256",),
    "docs/jpeg.md": ("jpeg256",),
    "README.md": ("which",),
}
PAGES = tuple(PAGE_TABLES)


# --------------------------------------------------------------------------- pages


def table_builders(docs: Path, page_dir: Path) -> dict[str, Callable[[], str]]:
    """Every table a page may ask for by name, as a function of the files under ``docs``."""
    bench = docs / "bench"
    blink = _rel(bench, page_dir)
    dlink = _rel(docs, page_dir)

    def src(name: str) -> Source:
        return load_source(bench, name)

    return {
        "glance": lambda: glance_table([("256 px", src("local256_det")), ("64 px", src("local64_det"))], blink),
        "local256": lambda: grid_table([src("local256_det"), src("local256_50nfe")], blink),
        "local256_seed1": lambda: grid_table([src("local256_seed1")], blink),
        "paper256": lambda: grid_table([src("paper256_det")], blink),
        "paper256_per_image": lambda: per_image_table(src("paper256_det"), blink),
        "paper256_cost": lambda: cost_table([bench / "profile_paper" / f"{t}.json" for t in
                                             ("sr_bicubic", "deblur_gaussian", "deblur_motion")], blink),
        "local64": lambda: grid_table([src("local64_det"), src("local_nfe")], blink),
        "local_k4_25": lambda: grid_table([src("local_k4_25")], blink),
        "local100": lambda: grid_table([src("local")], blink),
        "local_default": lambda: grid_table([src("local_default")], blink, std=False),
        "which": lambda: which_table(src("local256_det"), src("local256_50nfe"), blink,
                                     bench / "blind256" / "results.csv", bench / "jpeg256" / "results.csv"),
        "calibration": lambda: calibration_table([bench / "calibration" / "calibration.csv",
                                                  bench / "calibration_nfc100" / "calibration.csv"], blink),
        "conformal_oracles": lambda: conformal_table([_conformal_csv(bench / "conformal_oracles" / "conformal.csv")],
                                                     bench, blink),
        "conformal_nfc_fast": lambda: conformal_table([_conformal_csv(bench / "conformal_nfc_fast" / t / "conformal.csv")
                                                       for t in ("sr_bicubic", "inpaint_random", "deblur_gaussian")],
                                                      bench, blink),
        **{f"conformal_methods_{k}": lambda t=t, k=k: conformal_table(  # NFC's rows, then every other sampler's
            [_conformal_csv(bench / "conformal_nfc_fast" / t / "conformal.csv"),
             _conformal_csv(bench / f"conformal_methods_{k}" / "conformal.csv")],
            bench, blink) for k, t in (("sr", "sr_bicubic"), ("inpaint_random", "inpaint_random"))},
        "calibration_shift": lambda: shift_doc_table(bench / "calibration_shift", blink),
        "oracle": lambda: oracle_table([("α = 2", bench / "oracle_alpha2_summary.md"),
                                        ("α = 3", bench / "oracle_alpha3_summary.md")], blink),
        "prior_report": lambda: prior_table(docs / "prior_report.json", dlink),
        "nonlinear64": lambda: nonlinear_doc_table(bench / "nonlinear64", blink),
        "noise_level256": lambda: noise_level_doc_table(bench / "noise_level256", blink),
        "noise_level128": lambda: noise_level_doc_table(bench / "noise_level128", blink),
        "noise_level_denoise128": lambda: denoise_doc_table(bench / "noise_level128", blink),
        "noise_level_shot128": lambda: shot_doc_table(bench / "noise_level_shot128", blink),
        "blind256": lambda: blind_doc_table(bench / "blind256", blink),
        "jpeg256": lambda: jpeg_doc_table(bench / "jpeg256", blink),
        "scale_cpu": lambda: scale_table(bench / "scale_cpu.json", blink),
        "restore_throughput": lambda: throughput_table(bench / "restore_throughput.json", blink),
    }


def _rel(target: Path, page_dir: Path) -> str:
    """``target`` as a link prefix relative to the page's folder ("bench/", "docs/bench/", "")."""
    try:
        rel = Path(target).resolve().relative_to(Path(page_dir).resolve())
    except ValueError:
        return Path(target).as_posix().rstrip("/") + "/"
    return "" if str(rel) == "." else rel.as_posix() + "/"


def check_markers(text: str, page: str, required: Sequence[str] = ()) -> None:
    """ValueError naming ``page`` and the table when a marker is malformed (not ``<!-- table:NAME -->``
    or ``<!-- /table -->``, an opening one not ending its line), an opening marker has no closing one
    before the next table, a closing marker has no opening one, or a table of ``required`` is not
    on the page."""
    names, open_name, open_line = [], None, 0
    missing = [t for t in required if f"<!-- table:{t} -->" not in text]
    gone = f" (the page must hold table {', '.join(repr(t) for t in missing)})" if missing else ""
    for m in ANY_MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group("close"):
            if m.group(0).rstrip("\n") != "<!-- /table -->":
                raise ValueError(f"{page}, line {line}: malformed closing marker {m.group(0).strip()!r}; write "
                                 f"'<!-- /table -->'")
            if open_name is None:
                after = f" after table {names[-1]!r}" if names else ""
                raise ValueError(f"{page}, line {line}: a closing marker '<!-- /table -->'{after} has no opening "
                                 f"marker '<!-- table:NAME -->' before it{gone}; restore the opening marker")
            open_name = None
            continue
        name = m.group("name")
        if m.group(0) != f"<!-- table:{name} -->\n" or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"{page}, line {line}: malformed opening marker {m.group(0).strip()!r} of table "
                             f"{name!r}; write '<!-- table:NAME -->' on a line of its own")
        if open_name is not None:
            raise ValueError(f"{page}, line {open_line}: table {open_name!r} has no closing marker '<!-- /table -->' "
                             f"before table {name!r} (line {line})")
        names.append(name)
        open_name, open_line = name, line
    if open_name is not None:
        raise ValueError(f"{page}, line {open_line}: table {open_name!r} has no closing marker '<!-- /table -->'")
    if missing:
        raise ValueError(f"{page}: no table {', '.join(repr(t) for t in missing)}: the page must hold "
                         + " and ".join(f"'<!-- table:{t} -->' ... '<!-- /table -->'" for t in missing))


def render_page(text: str, builders: dict[str, Callable[[], str]], page: str = "<page>",
                required: Sequence[str] = ()) -> str:
    """``text`` with the body of every ``<!-- table:NAME -->`` ... ``<!-- /table -->`` block
    regenerated; its markers checked first (:func:`check_markers`, naming ``page``)."""
    check_markers(text, page, required)

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in builders:
            raise ValueError(f"{page}: unknown table {name!r} (known: {', '.join(sorted(builders))})")
        return m.group(1) + builders[name]().rstrip("\n") + "\n" + m.group(4)

    return MARKER.sub(sub, text)


def update_pages(root: Path, pages: Sequence[str] | None = None, check: bool = False,
                 docs: Path | None = None) -> list[Path]:
    """Regenerate the tables of ``pages`` (relative to ``root``; None: :data:`PAGE_TABLES`'s) from
    ``root/docs``; return the pages that changed (with ``check``, that would change: nothing is
    written). A page of :data:`PAGE_TABLES` must hold its tables; every page's markers are checked
    (:func:`check_markers`: ValueError naming the page and the table) before anything is written."""
    root = Path(root)
    docs = Path(docs) if docs is not None else root / "docs"
    pages = tuple(PAGE_TABLES) if pages is None else pages
    changed = []
    for rel in pages:
        page = root / rel
        if not page.is_file():
            continue
        old = page.read_text()
        new = render_page(old, table_builders(docs, page.parent), str(page), PAGE_TABLES.get(rel, ()))
        if new != old:
            changed.append((page, new))
    if not check:
        for page, new in changed:
            atomic_write_text(page, new)
    return [page for page, _ in changed]


def run_report(root: Path, check: bool = False) -> int:
    """``nfc-dps bench report``: 0, or 1 when ``check`` finds a page out of date."""
    root = Path(root)
    if not (root / "docs" / "bench").is_dir():
        raise FileNotFoundError(f"{root / 'docs' / 'bench'} not found: run the report from the repository root "
                                f"(or pass --root)")
    changed = update_pages(root, check=check)
    verb = "out of date" if check else "regenerated"
    for page in changed:
        print(f"{verb}: {page}", file=sys.stderr if check else sys.stdout)
    if not changed:
        print("tables up to date")
    return 1 if (check and changed) else 0

"""nfc_dps.bench.report (`nfc-dps bench report`): tables between marker comments, generated from
result files; idempotent; and the committed docs are what the committed result files give."""

from __future__ import annotations

import csv
from itertools import product
from pathlib import Path

import pytest

from nfc_dps.bench import report
from nfc_dps.bench.tables import COLUMNS

REPO = Path(__file__).resolve().parents[1]


def _row(task, image, method, est, budget, psnr, nfe=None):
    r = {c: "" for c in COLUMNS}
    r.update(protocol="local", task=task, image=image, method=method, estimator=est, budget=str(budget),
             nfe=str(budget if nfe is None else nfe), psnr=f"{psnr:.4f}", ssim="0.5", seed="0")
    return r


def _write(path: Path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


@pytest.fixture()
def fake_repo(tmp_path: Path, monkeypatch) -> Path:
    """A repository whose one page, docs/benchmarks.md, must hold the one table local256_seed1."""
    monkeypatch.setattr(report, "PAGE_TABLES", {"docs/benchmarks.md": ("local256_seed1",)}, raising=False)
    bench = tmp_path / "docs" / "bench"
    bench.mkdir(parents=True)
    rows = []
    for task, base in (("sr_bicubic", 20.0), ("deblur_motion", 24.0)):
        for image, off in (("a", 0.0), ("b", 1.0)):
            rows += [_row(task, image, "nfc:deterministic", "deterministic", 16, base + 2 + off),
                     _row(task, image, "dpir", "deterministic", 8, base + 1 + off),
                     _row(task, image, "tv", "deterministic", 0, base + off),
                     _row(task, image, "nfc", "sample", 20, base - 1 + off),
                     _row(task, image, "nfc", "mean4", 20, base + 0.5 + off, nfe=80)]
    rows.append(_row("sr_bicubic", "a", "bicubic", "deterministic", 0, 19.0))
    rows.append(_row("sr_bicubic", "b", "bicubic", "deterministic", 0, 21.0))
    _write(bench / "local256_seed1_results.csv", rows)
    (bench / "local256_seed1_summary.md").write_text(
        "# Benchmark summary (local protocol)\n\n- **date**: 2026-01-02T03:04:05\n- **images**: 2 (a, b), 64x64\n"
        "- **preset / budgets**: fast / preset NFE\n- **seed**: 0\n")
    (tmp_path / "docs" / "benchmarks.md").write_text(
        "# Page\n\nIntro.\n\n<!-- table:local256_seed1 -->\nstale text\n<!-- /table -->\n\nOutro.\n")
    return tmp_path


def test_report_writes_the_table_and_is_idempotent(fake_repo: Path) -> None:
    changed = report.update_pages(fake_repo, pages=("docs/benchmarks.md",))
    assert changed == [fake_repo / "docs" / "benchmarks.md"]
    text = (fake_repo / "docs" / "benchmarks.md").read_text()
    assert "stale text" not in text and text.startswith("# Page\n\nIntro.\n\n<!-- table:local256_seed1 -->\n")
    assert text.endswith("<!-- /table -->\n\nOutro.\n")
    lines = {ln.split(" | ")[0]: ln for ln in text.splitlines() if ln.startswith("| ")}
    # means over the two images, std with ddof 1; the best mean of each task column in bold
    assert lines["| NFC `deterministic`"] == "| NFC `deterministic` | 16 | **22.50** ± 0.71 | **26.50** ± 0.71 |"
    assert lines["| DPIR `fast`"] == "| DPIR `fast` | 8 | 21.50 ± 0.71 | 25.50 ± 0.71 |"
    assert lines["| NFC `fast`, mean of 4"] == "| NFC `fast`, mean of 4 | 80 | 21.00 ± 0.71 | 25.00 ± 0.71 |"
    assert lines["| TV"] == "| TV | – | 20.50 ± 0.71 | 24.50 ± 0.71 |"
    assert lines["| bicubic"] == "| bicubic | – | 20.00 ± 1.41 | – |"
    assert "| method | NFE | SR ×4 | motion deblur |" in text
    assert "2 images (a, b), 64x64; measured 2026-01-02" in text
    # network rows first, the classical ones last
    order = [k for k in lines if k not in ("| method", "|---")]
    assert order.index("| NFC `fast`") < order.index("| DPIR `fast`") < order.index("| TV")
    # a second run changes nothing, and --check agrees
    assert report.update_pages(fake_repo, pages=("docs/benchmarks.md",)) == []
    assert (fake_repo / "docs" / "benchmarks.md").read_text() == text
    assert report.run_report(fake_repo, check=True) == 0


def test_check_mode_reports_a_stale_page_and_writes_nothing(fake_repo: Path) -> None:
    page = fake_repo / "docs" / "benchmarks.md"
    before = page.read_text()
    assert report.run_report(fake_repo, check=True) == 1
    assert page.read_text() == before
    assert report.run_report(fake_repo) == 0 and report.run_report(fake_repo, check=True) == 0


def test_unknown_table_name_is_an_error(fake_repo: Path) -> None:
    page = fake_repo / "docs" / "benchmarks.md"
    page.write_text(page.read_text() + "<!-- table:no_such_table -->\n<!-- /table -->\n")
    with pytest.raises(ValueError, match="no_such_table"):
        report.update_pages(fake_repo, pages=("docs/benchmarks.md",))


@pytest.mark.parametrize("cut", ["opening", "closing", "both"])
def test_a_missing_marker_is_an_error_naming_the_page_and_the_table(fake_repo: Path, cut: str, capsys) -> None:
    from nfc_dps.cli import main

    page = fake_repo / "docs" / "benchmarks.md"
    report.update_pages(fake_repo)
    text = page.read_text()
    for marker in {"opening": ["<!-- table:local256_seed1 -->\n"], "closing": ["<!-- /table -->"],
                   "both": ["<!-- table:local256_seed1 -->\n", "<!-- /table -->"]}[cut]:
        text = text.replace(marker, "")
    page.write_text(text)
    for check in (True, False):
        with pytest.raises(ValueError, match=r"benchmarks\.md.*'local256_seed1'"):
            report.run_report(fake_repo, check=check)
        assert page.read_text() == text  # nothing regenerated, nothing written
    assert main(["bench", "report", "--root", str(fake_repo), "--check"]) == 2
    err = capsys.readouterr().err
    assert "benchmarks.md" in err and "local256_seed1" in err and "Traceback" not in err


def test_a_deleted_opening_marker_of_a_committed_page_is_named(tmp_path: Path) -> None:
    """The repository's own pages: each must hold its tables (report.PAGE_TABLES)."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert "<!-- table:local256_seed1 -->\n" in text
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks.md").write_text(text.replace("<!-- table:local256_seed1 -->\n", ""))
    with pytest.raises(ValueError, match=r"benchmarks\.md, line \d+: a closing marker.*'local256_seed1'"):
        report.update_pages(tmp_path, pages=("docs/benchmarks.md",), check=True, docs=REPO / "docs")


def test_a_malformed_marker_is_named(fake_repo: Path) -> None:
    page = fake_repo / "docs" / "benchmarks.md"
    page.write_text(page.read_text().replace("<!-- table:local256_seed1 -->\n", "<!-- table:local256_seed1-->\n"))
    with pytest.raises(ValueError, match="line 5: malformed opening marker"):
        report.run_report(fake_repo, check=True)


@pytest.mark.parametrize("row, problem", [("sr_bicubic,a,nfc", "3 fields, the header has 15"),
                                          ("local,sr_bicubic,a,tv,deterministic,0,0,high" + "," * 7,
                                           "psnr 'high' is not a number"),
                                          ("local,sr_bicubic,a,tv,deterministic,x" + "," * 9, "budget 'x'"),
                                          ("local,sr_bicubic,,tv,deterministic,0" + "," * 9, "empty image"),
                                          ("local,sr_bicubic,a,tv,deterministic,0" + "," * 10, "16 fields")])
def test_a_malformed_result_row_is_named_by_file_and_line(fake_repo: Path, row: str, problem: str, capsys) -> None:
    from nfc_dps.cli import main

    csv_path = fake_repo / "docs" / "bench" / "local256_seed1_results.csv"
    lines = csv_path.read_text().splitlines()
    lines.insert(3, row)
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"local256_seed1_results\.csv, line 4: malformed row: {problem}"):
        report.run_report(fake_repo, check=True)
    assert main(["bench", "report", "--root", str(fake_repo), "--check"]) == 2
    err = capsys.readouterr().err
    assert "local256_seed1_results.csv, line 4" in err and "Traceback" not in err


def test_a_malformed_calibration_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "calibration.csv"
    path.write_text("setting,method,budget,k,width,observed,expected\ngaussian,exact,0,4,0.1,0.0675,0.0656\n"
                    "gaussian,exact,0,four,0.1,0.07,0.06\n")
    with pytest.raises(ValueError, match=r"calibration\.csv, line 3: malformed row: k 'four' is not an int"):
        report.calibration_table([path], "bench/")


def test_cli_report_runs_through_nfc_dps_bench(fake_repo: Path) -> None:
    from nfc_dps.cli import main

    assert main(["bench", "report", "--root", str(fake_repo)]) == 0
    assert "| NFC `deterministic` | 16 |" in (fake_repo / "docs" / "benchmarks.md").read_text()
    assert main(["bench", "report", "--root", str(fake_repo), "--check"]) == 0


def test_committed_docs_are_generated_from_the_committed_result_files(tmp_path: Path) -> None:
    """Regenerating every page from docs/ gives the committed text: nobody hand-edits a table."""
    pages = [p for p in report.PAGES if (REPO / p).is_file()]
    stale = report.update_pages(REPO, pages=pages, check=True)
    assert stale == [], (f"{', '.join(str(p.relative_to(REPO)) for p in stale)} differ from the result files "
                         f"in docs/: run `nfc-dps bench report` and commit")
    # and every page that the report serves has at least one table in it
    for rel in ("docs/benchmarks.md", "docs/prior.md"):
        assert "<!-- table:" in (REPO / rel).read_text()


def test_per_image_table_takes_the_best_dpir_and_the_cost_per_call() -> None:
    """NFC minus the better DPIR row per image (a missing DPIR row is left out, both missing: "–"),
    and NFC's seconds per network call on each task over its SR x4 cost."""
    def row(task, image, method, psnr, seconds="1.0", nfe="16"):
        return {"task": task, "image": image, "method": method, "estimator": "deterministic", "budget": nfe,
                "nfe": nfe, "psnr": psnr, "seconds": seconds}

    rows = [row("sr_bicubic", "a", "nfc:deterministic", "25.0", "1.6"), row("sr_bicubic", "a", "dpir", "24.0", "1", "8"),
            row("sr_bicubic", "a", "dpir:paper", "25.5", "3", "24"),
            row("deblur_motion", "a", "nfc:deterministic", "27.0", "2.4"), row("deblur_motion", "a", "dpir", "26.0", "1", "8"),
            row("deblur_motion", "b", "nfc:deterministic", "28.0", "2.4")]
    text = report.per_image_table(report.Source(Path("x_results.csv"), rows, {"preset / budgets": "fast"}), "")
    lines = {tuple(c.strip() for c in l.split("|")[1:3]): l for l in text.splitlines() if l.startswith("| ")}
    assert lines[("SR ×4", "a")].endswith("| -0.50 |") and lines[("motion deblur", "a")].endswith("| +1.00 |")
    assert lines[("motion deblur", "b")].endswith("| – |")
    assert "motion deblur 1.50×" in text


def test_cost_table_divides_each_method_by_its_own_sr_cost(tmp_path: Path) -> None:
    """Each method's time per network call over the same method's on SR x4; a method without an SR
    run gets "–"."""
    import json

    def write(task, methods):
        f = tmp_path / f"{task}.json"
        f.write_text(json.dumps({"task": task, "size": 256, "device": "cpu", "machine": {"torch_threads": 1, "cpu": "x"},
                                 "methods": {m: {"per_nfe_s": t, "network_per_call_s": 0.3} for m, t in methods.items()}}))
        return f

    files = [write("sr_bicubic", {"nfc:deterministic": 0.4, "dpir:paper": 0.5}),
             write("deblur_motion", {"nfc:deterministic": 0.5, "dpir:paper": 0.55, "daps": 0.9})]
    rows = {tuple(c.strip() for c in l.split("|")[1:3]): l for l in report.cost_table(files, "").splitlines()
            if l.startswith("| ") and "---" not in l}
    assert rows[("motion deblur", "NFC `deterministic`")].endswith("| 500 | 300 | 1.25× |")
    assert rows[("motion deblur", "DPIR `paper`")].endswith("| 1.10× |")
    assert rows[("motion deblur", "DAPS `fast`")].endswith("| – |")


# --------------------------------------------------------------------------- the documented commands

def _documented_bench_commands(page: Path) -> list[list[str]]:
    """The arguments of every `nfc-dps bench` run a page's code blocks show (`bench NAME ...` through
    docs/benchmarks.md's helper, `nfc-dps bench ...`, `torchrun ... -m nfc_dps bench ...`), with the
    blocks' shell variables expanded (a `for` loop's every value: one command each; the placeholder
    TASK as sr_bicubic)."""
    import re
    import shlex

    blocks = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", page.read_text(), re.S) if lang in ("", "bash")]
    out = []
    for block in blocks:
        text = block.replace("\\\n", " ")
        env, loops = {"a": "2"}, {}
        for line in text.splitlines():
            line = line.split(" #")[0].strip()
            if "bench()" in line or "${@" in line:  # the helper's definition
                continue
            if loop := re.match(r"for (\w+) in ([^;]+);", line):
                loops[loop.group(1)] = loop.group(2).split()
            for name, value in re.findall(r"(?:^|;\s*)([A-Z]+)=(\"[^\"]*\"|[^\s;]+)", line):
                env[name] = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), value.strip('"'))
            used = [v for v in loops if re.search(rf"\$\{{?{v}\b", line)]
            for values in product(*(loops[v] for v in used)):
                here = {**env, **dict(zip(used, values))}
                cmd = re.sub(r"\$\{?(\w+)\}?", lambda m: here.get(m.group(1), m.group(0)), line)
                cmd = re.sub(r"\bTASK\b", "sr_bicubic", cmd)  # docs/interval_coverage.md's placeholder
                if cmd.startswith("bench ") and not cmd.startswith("bench()"):
                    words = shlex.split(cmd)
                    out.append(["--out", f"runs/bench/{words[1]}", *words[2:]])
                elif m := re.search(r"(?:nfc-dps|-m nfc_dps) bench (?!report)(.*?)(?:&&|;|$)", cmd):
                    out.append(shlex.split(m.group(1)))
    return out


def test_documented_commands_expand_every_loop_value(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```bash\nfor t in sr_bicubic deblur_motion; do\n  nfc-dps bench --tasks $t --out runs/$t\ndone\n```\n")
    assert _documented_bench_commands(page) == [["--tasks", "sr_bicubic", "--out", "runs/sr_bicubic"],
                                                ["--tasks", "deblur_motion", "--out", "runs/deblur_motion"]]


@pytest.mark.parametrize("page, least", [("docs/benchmarks.md", 9), ("docs/benchmarks_64px.md", 5),
                                         ("docs/interval_coverage.md", 4), ("docs/uncertainty.md", 2),
                                         ("docs/nonlinear.md", 1)])
def test_the_documented_bench_commands_parse_and_build_their_columns(page, least):
    """Every benchmark command the docs tell a user to run is accepted: its flags parse, its spec
    builds, and on the grid protocols every column's sampler config resolves (a renamed flag or a
    preset key that moved would otherwise surface only when someone reruns a table)."""
    from nfc_dps.bench.cli import build_parser, spec_from_args
    from nfc_dps.bench.spec import method_runs

    root = Path(__file__).resolve().parents[1]
    commands = _documented_bench_commands(root / page)
    assert len(commands) >= least, commands
    for argv in commands:
        spec = spec_from_args(build_parser().parse_args(argv))
        if spec.protocol in ("local", "paper"):
            assert method_runs(spec), argv


def test_scale_tables_come_from_their_json_and_name_a_missing_key(tmp_path: Path) -> None:
    """docs/scale.md's tables: peak above base per megapixel, throughput against the first row; a row
    without a field is an error naming the file and the field."""
    import json

    from nfc_dps.bench.report_scale import scale_table, throughput_table

    scale = tmp_path / "scale.json"
    scale.write_text(json.dumps({"rows": [{"size": 512, "task": "sr_bicubic", "s_per_nfe": 4.04, "forward_s": 5.0,
                                           "peak_mb": 1000, "base_mb": 400, "megapixels": 0.25}]}))
    assert "| 512² | SR ×4 | 4.0 | 5.0 | 1000 | 400 | 2400 |" in scale_table(scale, "bench/")
    tp = tmp_path / "tp.json"
    rows = [{"batch_size": 1, "images": 4, "seconds": 8.0, "images_per_s": 0.5, "mean_psnr": 30.0,
             "max_abs_diff_vs_first": 0.0},
            {"batch_size": 8, "images": 4, "seconds": 4.0, "images_per_s": 1.0, "mean_psnr": 30.0,
             "max_abs_diff_vs_first": 0.004}]
    tp.write_text(json.dumps({"rows": rows}))
    table = throughput_table(tp, "bench/")
    assert "| 8 | 4.0 | 1.00 | 2.00× | 30.00 dB | 0.004 |" in table and "seconds for 4 images" in table
    del rows[1]["mean_psnr"]
    tp.write_text(json.dumps({"rows": rows}))
    with pytest.raises(ValueError, match="tp.json: row 1 has no mean_psnr"):
        throughput_table(tp, "bench/")

"""summary.md's row labels state the network calls a row spent (issue 51 F10): NFC's denoising
spends 8 calls at the 16-call budget, and its row said "@16". Failed before the fix."""

from __future__ import annotations

from types import SimpleNamespace

from nfc_dps.bench.tables import summary_markdown

TASKS = ["sr_bicubic", "denoise"]
SPEC = SimpleNamespace(protocol="local", tasks=TASKS, methods=["nfc:deterministic", "nfc", "dpir", "tv"])


def row(task, image, method, estimator, budget, nfe, psnr=30.0, note=""):
    return {"protocol": "local", "task": task, "image": image, "method": method, "estimator": estimator,
            "budget": str(budget), "nfe": str(nfe), "psnr": "" if note else f"{psnr:.4f}",
            "ssim": "" if note else "0.80000", "seconds": "1.000", "peak_mem_mb": "1.0", "note": note}


def rows():
    out = []
    for image in ("a", "b"):
        out += [row("sr_bicubic", image, "nfc:deterministic", "deterministic", 16, 16, 26.0),
                row("denoise", image, "nfc:deterministic", "deterministic", 16, 8, 38.0),  # 8 calls at budget 16
                row("sr_bicubic", image, "nfc", "sample", 16, 16), row("sr_bicubic", image, "nfc", "mean4", 16, 64),
                row("denoise", image, "nfc", "sample", 16, 16), row("denoise", image, "nfc", "mean4", 16, 64),
                row("sr_bicubic", image, "dpir", "deterministic", 8, 8), row("denoise", image, "dpir", "deterministic",
                                                                             8, 8),
                row("sr_bicubic", image, "tv", "deterministic", 0, 0), row("denoise", image, "tv", "deterministic", 0, 0)]
    return out


def table_lines(text, heading):
    part = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [ln for ln in part.splitlines() if ln.startswith("| ")]


def test_a_row_that_spent_fewer_calls_on_a_task_names_them():
    text = summary_markdown(SPEC, rows(), {}, [], [])
    for heading in ("## PSNR (mean ± std)", "## SSIM (mean ± std)"):
        labels = [ln.split(" | ")[0] for ln in table_lines(text, heading)]
        assert "| nfc:deterministic @16 (8 on denoise)" in labels, labels
        # rows that spent their budget on every task keep the plain label (a mean of 4: 4 chains of 16)
        assert "| nfc @16" in labels and "| nfc (mean of 4) @16" in labels and "| dpir @8" in labels
        assert "| tv" in labels
    # the time table lists each count (not their mean, 12) and the label
    timing = {ln.split(" | ")[0]: ln.split(" | ")[1] for ln in table_lines(text, "## Time and memory")}
    assert timing["| nfc:deterministic @16 (8 on denoise)"] == "16/8"
    assert timing["| nfc (mean of 4) @16"] == "64" and timing["| dpir @8"] == "8" and timing["| tv"] == "0"


def test_psnr_vs_nfe_says_what_a_cell_spent():
    text = summary_markdown(SPEC, rows(), {}, [], [])
    denoise = text.split("**denoise**", 1)[1].split("\n\n", 2)[1]
    sr = text.split("**sr_bicubic**", 1)[1].split("\n\n", 2)[1]
    assert "| nfc:deterministic | – | 38.00 (8 calls) |" in denoise
    assert "| nfc:deterministic | – | 26.00 |" in sr and "(8 calls)" not in sr


def test_chain_calls_counts_one_chain_and_skips_failed_rows():
    from nfc_dps.bench.tables import chain_calls

    rs = [row("denoise", "a", "nfc", "mean4", 16, 64), row("denoise", "b", "nfc", "mean4", 16, 32),
          row("denoise", "c", "nfc", "mean4", 16, 0, note="out of memory")]
    assert chain_calls(rs) == [16, 8]
    assert chain_calls([row("denoise", "a", "nfc", "sample", 16, "")]) == []

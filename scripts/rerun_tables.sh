#!/usr/bin/env bash
# Rerun every generated table (and the README's demo grid) that depends on the embedded prior or a preset, and copy its result files
# into docs/bench/ (then: nfc-dps bench report, a CHANGELOG entry, commit). Run it after shipping new
# weights in assets/default_prior or changing a preset.
#
#   bash scripts/rerun_tables.sh                 # every table, in the order below
#   PRIOR_LABEL="step 3600+6500+8860" bash scripts/rerun_tables.sh   # PRIOR_LABEL: recorded by the prior report
#   bash scripts/rerun_tables.sh paper256_det local256_det    # some of them
#   bash scripts/rerun_tables.sh --list          # the table names
#
# Runs go to runs/tables/<prior sha>/NAME, so a rerun after an interruption (another day, another
# session) resumes: a finished table is skipped, an unfinished `bench` table continues row by row, and
# runs of other weights are never mixed in. Nothing is copied into docs/ until a table's run has
# finished. Two CPU processes by default (PROCS=N to change) for the grids and the every-method
# calibration runs; the profile, the prior report, NFC's calibration runs and the throughput use one
# process each. The oracle tables need no network and are not here (docs/benchmarks.md,
# docs/interval_coverage.md).
# On 2 CPU cores the whole set takes three to four hours.
set -euo pipefail
cd "$(dirname "$0")/.."

# the order: quick tables first, then the long calibration runs (which restart when interrupted)
# interleaved with the resumable grids
TABLES=(paper256_det profile_paper prior_report local256_det local256_seed1 local64_det
        conformal_nfc_fast calibration calibration_nfc100 conformal_methods_sr local_k4_25 local_nfe local
        conformal_methods_inpaint_random local_default local256_50nfe demo_grid restore_throughput)
if [[ "${1:-}" == "--list" ]]; then printf '%s\n' "${TABLES[@]}"; exit 0; fi
names=("$@"); [[ ${#names[@]} -gt 0 ]] || names=("${TABLES[@]}")
for name in "${names[@]}"; do  # every name checked before hours of work start
    [[ " ${TABLES[*]} " == *" $name "* ]] || { echo "unknown table '$name'; the tables: ${TABLES[*]}" >&2; exit 2; }
    [[ $name != prior_report || -n "${PRIOR_LABEL:-}" ]] || { echo "prior_report needs PRIOR_LABEL (e.g. the training steps)" >&2; exit 2; }
done

PROCS=${PROCS:-2}
SHA=$(python -c "from nfc_dps.priors.default import prior_identity; print(prior_identity(None, contents=True)['sha256'])")
ROOT=runs/tables/$SHA
mkdir -p "$ROOT"
echo "embedded prior $SHA; runs in $ROOT"

# A `bench` table: its results.csv and summary.md become docs/bench/NAME_results.csv and NAME_summary.md.
bench() {
    torchrun --nproc_per_node="$PROCS" --standalone -m nfc_dps bench --threads 1 --no-images \
        --out "$ROOT/$1" "${@:2}"
    for f in results.csv summary.md; do cp "$ROOT/$1/$f" "docs/bench/$1_$f"; done
}
# A calibration-protocol table on VALIDATION / TEST tiles: conformal.csv, calibration.csv and summary.md
# into docs/bench/DEST/.
conformal() {
    local name=$1 dest=$2 validation=$3 test=$4; shift 4
    rm -rf "$ROOT/$name"
    "$@" --protocol calibration --out "$ROOT/$name" --threads 1 --embedded-budget 100 --samples 16 \
        --size 48 --validation-images "$validation" --num-images "$test"
    mkdir -p "docs/bench/$dest"
    cp "$ROOT/$name"/{conformal.csv,calibration.csv,summary.md} "docs/bench/$dest/"
}
I256="--size 256 --zoom 1 --image-names astronaut,coffee,chelsea"
T=sr_bicubic,inpaint_box,inpaint_random,deblur_gaussian,deblur_motion,denoise  # the standard tasks and denoising
C=wiener,tv,bicubic,biharmonic
A=nfc,nfc:deterministic,daps,dps,diffpir,ddnm,ddrm,dpir,$C
MULTI="torchrun --nproc_per_node=$PROCS --standalone -m nfc_dps bench"

run_table() {
    case $1 in
    paper256_det) bench paper256_det --protocol paper --size 256 --zoom 1 \
        --image-names astronaut,coffee,chelsea,camera --preset fast \
        --methods nfc:deterministic,dpir,dpir:paper,tv,wiener,bicubic,biharmonic ;;
    profile_paper)  # one process alone: the cost of a network call on each operator
        mkdir -p docs/bench/profile_paper
        for t in sr_bicubic deblur_gaussian deblur_motion; do
            rm -rf "$ROOT/profile_paper/$t"
            nfc-dps bench --profile --protocol paper --size 256 --zoom 1 --image-names chelsea --tasks $t \
                --methods nfc:deterministic,dpir:paper --threads 1 --out "$ROOT/profile_paper/$t"
            cp "$ROOT/profile_paper/$t/profile.json" "docs/bench/profile_paper/$t.json"
        done ;;
    prior_report) nfc-dps prior-report --label "$PRIOR_LABEL" \
        --no-overlap --no-whole --threads 2 --timing-runs 5 --out docs/prior_report.json --markdown ;;
    local256_det) bench local256_det $I256 --tasks $T --methods nfc:deterministic,dpir,dpir:paper,tv,wiener,bicubic,biharmonic ;;
    local256_50nfe) bench local256_50nfe $I256 --tasks $T --methods nfc,nfc:fast_psnr,ddnm --budgets 50 ;;
    local256_seed1) bench local256_seed1 $I256 --tasks sr_bicubic,deblur_gaussian,deblur_motion \
        --methods nfc:deterministic,dpir,dpir:paper,tv --seed 1 ;;
    local64_det) bench local64_det --methods nfc:deterministic,dpir,dpir:paper,$C ;;
    local_nfe) bench local_nfe --budgets 20,50 --methods $A ;;
    local_k4_25) bench local_k4_25 --budgets 25 --samples 4 --set nfc.inner_temperature=0 \
        --methods nfc,nfc:deterministic,ddnm,ddrm,diffpir,dpir,$C ;;
    local) bench local --budgets 100 --methods $A,nfc:fast_psnr ;;
    demo_grid)  # README's picture of every standard task
        rm -rf "$ROOT/demo" && nfc-dps demo --tasks all --output "$ROOT/demo" && cp "$ROOT/demo/grid.png" docs/demo_grid.png ;;
    restore_throughput)  # one process alone: the folder's wall time at --batch-size 1 and 8, and its mean PSNR
        python scripts/restore_throughput.py --count 16 --threads 1 --out "$ROOT/restore_throughput.json" \
            --figure "$ROOT/restore_throughput.png"
        cp "$ROOT/restore_throughput.json" docs/bench/ && cp "$ROOT/restore_throughput.png" docs/ ;;
    local_default) bench local_default --preset paper --image-names astronaut --methods $A ;;
    calibration)
        rm -rf "$ROOT/calibration"
        nfc-dps bench --protocol calibration --out "$ROOT/calibration" --threads 2
        cp "$ROOT/calibration"/{calibration.csv,config.json,summary.md} docs/bench/calibration/
        cp "$ROOT/calibration/reliability.png" docs/calibration_reliability.png ;;
    calibration_nfc100)
        rm -rf "$ROOT/calibration_nfc100"
        nfc-dps bench --protocol calibration --out "$ROOT/calibration_nfc100" --methods nfc --embedded-budget 100 \
            --tasks embedded-sr_bicubic,embedded-inpaint_random,embedded-deblur_gaussian --threads 2
        cp "$ROOT/calibration_nfc100"/{calibration.csv,config.json,summary.md} docs/bench/calibration_nfc100/ ;;
    conformal_nfc_fast)  # one process per task, two at a time; 48 validation / 36 test tiles (12 test tiles
        # leave the coverage a standard error of about a point, half of the 88-92 % band's 2 either side)
        conformal conformal_sr_bicubic conformal_nfc_fast/sr_bicubic 48 36 \
            nfc-dps bench --tasks embedded-sr_bicubic --methods nfc &
        local pid=$!
        conformal conformal_inpaint_random conformal_nfc_fast/inpaint_random 48 36 \
            nfc-dps bench --tasks embedded-inpaint_random --methods nfc
        wait $pid
        conformal conformal_deblur_gaussian conformal_nfc_fast/deblur_gaussian 48 36 \
            nfc-dps bench --tasks embedded-deblur_gaussian --methods nfc ;;
    conformal_methods_sr) conformal conformal_methods_sr conformal_methods_sr 18 12 \
        $MULTI --tasks embedded-sr_bicubic --methods daps,dps,diffpir,ddnm ;;
    conformal_methods_inpaint_random) conformal conformal_methods_inpaint_random conformal_methods_inpaint_random 18 12 \
        $MULTI --tasks embedded-inpaint_random --methods daps,dps,diffpir,ddnm,ddrm ;;
    esac
}

for name in "${names[@]}"; do
    if [[ -e "$ROOT/$name.done" ]]; then echo "== $name: done earlier, skipped"; continue; fi
    echo "== $name: $(date -u +%H:%M:%S)"
    run_table "$name"
    touch "$ROOT/$name.done"
done
echo "== finished $(date -u +%H:%M:%S); now: nfc-dps bench report, a CHANGELOG entry, commit"

"""The benchmark harness (``nfc-dps bench``; docs/benchmarks.md): PSNR/SSIM
tables against the peers and classical baselines, NFE curves, timing and memory, the Gaussian
oracle, Gaussian-mixture and calibration protocols, a per-NFE profile, and sharding over torchrun
processes. Every protocol runs through one runner (:func:`nfc_dps.bench.runner.run_protocol`).

Grid: tasks x images x methods x NFE budgets, fixed seeds. Every seed is derived from
(--seed, task, image) alone (:func:`nfc_dps.restore_inputs.stable_seed`), so a row's numbers do not depend on
which process ran it, in which order, or with which other jobs.

Outputs (written atomically): results.csv (one row per task x image x method x estimator x
budget), summary.md (mean +- std tables, PSNR vs NFE, timing, memory, notes), config.json, the
restored images (OUT/images), and when matplotlib is installed psnr_vs_nfe.png and bars.png;
grid.png (one image across methods, every task) needs only PIL. Metrics are computed on
outputs clipped to [0, 1] (never rescaled); PSNR with data_range 1, SSIM with scikit-image's
conventions (:mod:`nfc_dps.metrics`). LPIPS only when the ``lpips`` package and its AlexNet
weights are on disk (nothing is downloaded); otherwise the column is empty.

Resumable: a rerun skips rows already in results.csv (or in a part file left by an interrupted
run). Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) a protocol's cases (the grid's: one
(task, image) each) are sharded round-robin over ranks; each rank appends its rows to
OUT/parts/rank{r}.csv, and after a barrier rank 0 merges them into results.csv in a canonical
order: the file equals a single-process run's except the timing and memory columns.

Modules:

- ``spec``: method lists, the protocols' tasks, :class:`~nfc_dps.bench.spec.BenchSpec`, the
  methods x budgets columns and their sampler configs;
- ``measurements``: the protocol's images and the measurement store (OUT/measurements);
- ``instruments``: machine description, peak memory, LPIPS, a row's metrics, PNG output;
- ``tables``: the grid's results.csv columns, part files, canonical row order, summary.md;
- ``plots``: grid.png, psnr_vs_nfe.png, bars.png;
- ``runner``: the one benchmark runner: a protocol's cases, resume, torchrun sharding
  (``nfc_dps.distributed``), part files and their merge, config.json, the summary's header;
- ``grid``: the local and paper protocols (one (task, image) a case);
- ``oracle``: the Gaussian-oracle protocol; ``mixture``: the Gaussian-mixture protocol;
  ``calibration`` (and ``calibration_report``): coverage of the std map and the conformal interval;
- ``report``: ``nfc-dps bench report``, the docs' tables from the committed result files;
- ``profiling``: time per NFE against the bare network, phases from the samplers' torch.profiler ranges;
- ``cli``: the command line (``main``, ``build_parser``, ``run_from_args``).
"""

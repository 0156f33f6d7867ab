"""The command line's arguments: one subparser per command, with its options and help."""

from __future__ import annotations

import argparse
from pathlib import Path

from dcco.version import __version__


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="run config, a TOML file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.rounds=200 "
                        "--set model.widths=[16,32,64]; repeatable")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="where to write the run (default: runs/<config>-<method>-<time>)")
    _add_data_dir(p)


def _add_tensorboard(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard scalars into each run directory "
                        "(sets train.tensorboard; needs pip install 'dcco[tensorboard]')")


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="the folder of the data set's files (sets data.data_dir); it is then "
                        "the only place searched. Default: the config's data.data_dir, else "
                        "$DCCO_DATA, ~/.cache/dcco and /usr/share/datasets/fashion-mnist")


def _with_data_dir(overrides: list[str], data_dir: Path | None,
                   tensorboard: bool = False) -> list[str]:
    """``overrides`` plus ``data.data_dir`` when ``--data-dir`` was given, and
    ``train.tensorboard`` with ``--tensorboard``."""
    from dcco.config import to_toml_value

    extra = [] if data_dir is None else [f"data.data_dir={to_toml_value(str(data_dir))}"]
    return [*overrides, *extra, *(["train.tensorboard=true"] if tensorboard else [])]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dcco",
        description="Federated training of dual encoders on small non-IID clients: DCCO "
                    "(Vemulapalli et al., ICLR 2023) and its baselines.",
    )
    parser.add_argument("--version", action="version", version=f"dcco {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pretrain", help="pretrain an encoder with a federated or centralized method",
                       description="Pretrain a dual encoder. Writes config, metrics, atomic "
                                   "checkpoints, a summary and plots into a run directory.")
    p.add_argument("config", type=Path, nargs="?", help="run config, a TOML file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. --set train.rounds=200; repeatable")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="where to write the run (default: runs/<config>-<method>-<time>)")
    _add_data_dir(p)
    _add_tensorboard(p)
    p.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                   help="continue an interrupted run from its last checkpoint (bit-identical on CPU)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress output (by default: a live bar on a terminal, a plain "
                        "line every 10%% or 30 s in a log)")

    p = sub.add_parser("config", help="print every setting: its key, type, default and doc",
                       description="Print the reference of every config setting (section, "
                                   "key, type, default, one line of doc), generated from the "
                                   "code; docs/config.md is its Markdown.")
    p.add_argument("--list", action="store_true",
                   help="list every setting (what plain `dcco config` does; kept for scripts)")
    p.add_argument("--markdown", action="store_true",
                   help="as Markdown tables (docs/config.md) instead of one line a key")

    p = sub.add_parser("evaluate", help="evaluate a pretrained run: linear probe, finetuning, "
                                        "k-NN, retrieval or the case protocols",
                       description="Evaluate the encoder of a run directory on its data set's "
                                   "test split; the projector is discarded. The result is added "
                                   "to the run's summary.json.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--protocol", choices=["linear", "finetune", "linear_y", "retrieval", "knn",
                                          "case_linear", "case_finetune"],
                   default="linear",
                   help="linear: frozen encoder + LARS linear classifier; finetune: whole "
                        "network with Adam; knn: the pretraining monitor (weighted k-NN in the "
                        "space of eval.knn_features); for paired data, linear_y: the linear "
                        "probe of the second tower, retrieval: cross-modal recall@1 and @5; "
                        "for data in natural clients, case_linear and case_finetune: each "
                        "case's images pooled, scored per case (default: linear)")
    p.add_argument("--labels", type=int, default=None,
                   help="labelled training samples, class-balanced (default: eval.labels of "
                        "the run's config; 500 uses the paper's 500-label probe settings); for "
                        "retrieval, the test pairs in the gallery; for knn, the bank's "
                        "training images (seeded, not class-balanced); for the case "
                        "protocols, labelled cases")
    _add_data_dir(p)
    p.add_argument("--no-progress", action="store_true", help="no progress output")

    p = sub.add_parser("supervised", help="supervised training from scratch on the labelled subset",
                       description="Train the same encoder architecture from scratch on the "
                                   "labelled subset (the paper's supervised baseline).")
    _add_config_args(p)
    p.add_argument("--labels", type=int, default=None, help="labelled training samples")
    p.add_argument("--no-progress", action="store_true", help="no progress output")

    p = sub.add_parser("compare", help="one table across runs (Markdown and CSV)",
                       description="Print one table across run directories and write it as "
                                   "Markdown and CSV, with a bar chart per evaluation.")
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=None, metavar="PREFIX",
                   help="output prefix: writes PREFIX.md, PREFIX.csv and PREFIX-<evaluation>.png "
                        "(default: comparison-<time>)")
    p.add_argument("--force", action="store_true",
                   help="overwrite the output files if they exist (refused otherwise)")
    p.add_argument("--tensorboard", action="store_true",
                   help="also print the command that shows these runs in TensorBoard")

    p = sub.add_parser("export", help="write a run's trained encoder for use elsewhere",
                       description="Write the trained dual encoder of a run directory as "
                                   "FILE.safetensors and its architecture as FILE.json; "
                                   "dcco.load_encoder(FILE.safetensors) reads them back "
                                   "without the run directory.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="where to write (.safetensors is added if missing; never overwrites)")

    p = sub.add_parser("reproduce", help="run a declarative experiment grid (paper Table 1)",
                       description="Run every cell of a grid file, skipping finished cells "
                                   "and resuming interrupted ones, then write the results table "
                                   "(mean ± std over seeds) and a plot.")
    p.add_argument("grid", type=Path, help="grid file, e.g. experiments/table1_fmnist.toml")
    p.add_argument("--scale", default="small", help="which [scale.NAME] to use (default: small)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder of the cells' run directories (default: runs/<grid>-<scale>)")
    p.add_argument("--results", type=Path, default=None,
                   help="also write the results section into this Markdown file "
                        "(e.g. docs/results/table1.md)")
    p.add_argument("--cells", action="append", default=[], metavar="PATTERN",
                   help="run only the cells whose folder name matches this shell pattern "
                        "(repeatable), e.g. '*-s2' or 'non-iid-*-dcco-*'; the table still "
                        "covers the whole grid. Cells another process is working on are "
                        "skipped, so two processes can share one --out")
    p.add_argument("--table-only", action="store_true",
                   help="run nothing; render the table from the finished cells")
    p.add_argument("--jobs", default="1", metavar="N",
                   help="cells run side by side, each in its own process (default 1: in this "
                        "process); 'auto': as many as the accelerator's free memory holds, "
                        "measured on the first cell (1 on a CPU)")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="stop within this many minutes: a cell starts only if its expected "
                        "time (measured here) fits in what is left, and running cells stop at "
                        "a checkpoint when it ends; the same command later resumes them")
    p.add_argument("--fill", action="store_true",
                   help="with --time-budget: start cells until the budget ends even where "
                        "they are not expected to finish in it; they stop at a checkpoint, "
                        "and the same command later resumes them (a grid longer than one "
                        "sitting)")
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    _add_data_dir(p)
    _add_tensorboard(p)
    p.add_argument("--no-progress", action="store_true", help="no progress output")

    p = sub.add_parser("demo", help="the main job: all methods on non-IID Fashion-MNIST, ~5 min on 2 cores",
                       description="Pretrain dcco, cco_fedavg, contrastive_fedavg and "
                                   "centralized_cco with the same budget on Fashion-MNIST with "
                                   "one-class clients, evaluate each with a linear probe, and "
                                   "compare with supervised-from-scratch and a random encoder.")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="output folder (default: runs/demo-<time>); give an interrupted "
                        "demo's folder to resume it")
    _add_data_dir(p)
    _add_tensorboard(p)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.KEY=VALUE", help="override a value of the demo config")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    return parser



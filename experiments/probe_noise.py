"""How much the linear probe moves by itself: the 5,000-label probe of one encoder with the
batch order of each of several probe seeds (the labelled subset and the features fixed), and
with ten times the probe's steps (issue 42; docs/results/reruns.md).

    python experiments/probe_noise.py RUN_DIR ... --out experiments/results/probe_noise.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dcco.run.rundir import RunDir, code_version


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from dcco.evaluate import labelled_subset
    from dcco.evaluate.features import extract_features
    from dcco.evaluate.probe import linear_probe_features
    from dcco.run.evaluations import eval_config_for, pretrained_model
    from dcco.run.splits import load_splits

    record = {"command": "python experiments/probe_noise.py " + " ".join(sys.argv[1:]),
              "code": code_version(), "runs": {}}
    cpu = torch.device("cpu")
    for path in args.runs:
        run = RunDir.open(path)
        cfg = run.config()
        train, test = load_splits(cfg)
        model = pretrained_model(cfg, run, train.input_shapes, cpu)
        ecfg = eval_config_for(cfg, 5000)
        ids = labelled_subset(train.labels, 5000, train.num_classes, cfg.train.seed)
        x_train = extract_features(model, train.images[ids], ecfg.feature_batch, cpu)
        x_test = extract_features(model, test.images, ecfg.feature_batch, cpu)

        def probe(seed: int, steps: int, ecfg=ecfg, x_train=x_train, x_test=x_test,
                  ids=ids, train=train, test=test) -> float:  # this run's, bound here
            e = replace(ecfg, probe_steps=steps)
            return 100 * linear_probe_features(x_train, train.labels[ids], x_test, test.labels,
                                               train.num_classes, e, seed).accuracy

        seeds = [probe(s, ecfg.probe_steps) for s in range(args.seeds)]
        longer = [probe(s, 10 * ecfg.probe_steps) for s in range(3)]
        record["runs"][str(path)] = {"probe_steps": ecfg.probe_steps, "by_probe_seed": seeds,
                                     "ten_times_the_steps": longer}
        print(f"{path}: {min(seeds):.2f}–{max(seeds):.2f} over {args.seeds} probe seeds; "
              f"{min(longer):.2f}–{max(longer):.2f} with {10 * ecfg.probe_steps} steps")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

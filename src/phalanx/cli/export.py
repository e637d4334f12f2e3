"""``phalanx export RUN_DIR``: write a trained policy as a self-contained ONNX or TorchScript file (one
per agent group for a multi-agent run).
"""

from __future__ import annotations

import argparse

from rich.console import Console

from phalanx.exporting import FORMATS, export


def cmd_export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx export",
        description="Write a trained policy as one self-contained file that runs without phalanx: raw "
        "observations (a float32 batch) in, actions in the env's action space out, with the observation "
        "normalisation and the action rescaling inside. ONNX runs with onnxruntime (pip install "
        "'phalanx[export]'), TorchScript with torch.jit.load. A multi-agent run gives one file per agent "
        "group. See docs/export.md.",
    )
    parser.add_argument("run_dir")
    parser.add_argument("--format", default="onnx", help=f"{' or '.join(FORMATS)} (default: onnx)")
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or a checkpoint path")
    parser.add_argument(
        "--output",
        default=None,
        help="the file to write (default: RUN_DIR/export/policy.onnx, policy.pt for TorchScript; "
        "policy_<group>.onnx per agent group)",
    )
    parser.add_argument(
        "--stochastic",
        action="store_true",
        help="export the sampling policy: the random draw is a second input, noise (see docs/export.md)",
    )
    args = parser.parse_args(argv)
    written = export(args.run_dir, args.format, args.checkpoint, args.output, args.stochastic)
    paths = written if isinstance(written, dict) else {"": written}
    out = Console()
    for group, path in paths.items():
        label = f"agent group {group}: " if group else ""
        out.print(f"written: {label}{path}", highlight=False, soft_wrap=True)
    return 0

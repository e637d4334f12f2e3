"""Helpers shared by the benchmark scripts: machine description, results files, markdown tables."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on (CPU, cores, torch, the load when measured)."""
    import gymnasium
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gymnasium": gymnasium.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1_5_15min": load_average(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def write_json(data: dict[str, Any], path: str | Path | None, default_name: str) -> Path:
    """Write ``data`` to ``path`` (default benchmarks/results/<default_name>); return the path."""
    if path is None:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = RESULTS_DIR / f"{default_name}-{stamp}.json"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None

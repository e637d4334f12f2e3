"""Config files: a YAML file of settings read into a dict (``--config``), and a TrainConfig written as the
``config.yaml`` of a run directory (the full resolved config, which eval and resume read back).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from phalanx.config.schema import TrainConfig
from phalanx.config.yaml_reader import parse_yaml
from phalanx.errors import ConfigError
from phalanx.files import write_text_atomic


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict, with errors that name the file."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(path)!r} does not exist. Check the path passed to --config."
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of settings (key: value), "
            f"got a {type(data).__name__}."
        )
    return data


def save_yaml(config: TrainConfig, path: str | Path) -> None:
    write_text_atomic(path, yaml.safe_dump(config.to_dict(), sort_keys=False))

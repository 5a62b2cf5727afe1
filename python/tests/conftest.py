"""Shared fixtures of the turboquant Python tests: the CLI (`tq`, for results to compare
with), the repository root and the model/corpus the LLM tests use when present."""
import os
import pathlib
import subprocess
import json

import numpy as np
import pytest

ROOT = pathlib.Path(os.environ.get("TQ_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


def _cli_path():
    p = os.environ.get("TQ_CLI")
    if p:
        return pathlib.Path(p)
    return ROOT / "build" / "tq"


@pytest.fixture(scope="session")
def tq_cli():
    p = _cli_path()
    if not p.exists():
        pytest.skip(f"no tq CLI at {p} (set TQ_CLI)")
    return p


def run_cli(cli, *args):
    """Runs `tq ARGS --json` and returns the parsed JSON object."""
    r = subprocess.run([str(cli), *map(str, args), "--json"], capture_output=True, text=True,
                       env={**os.environ, "TQ_NO_REEXEC": "0"})
    assert r.returncode == 0, f"tq {' '.join(map(str, args))} failed: {r.stderr}"
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def model_path():
    p = pathlib.Path(os.environ.get("TQ_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not p.exists():
        pytest.skip(f"no model at {p} (scripts/fetch-model.sh)")
    return p


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

"""Shared fixtures: the repository root and catalog lookups."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sweep.catalog import load_hardware, load_job

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


@pytest.fixture
def nersc_hw():
    """nersc_hw(system, nvlink_domain) -> the NERSC system with that domain size."""
    def make(system: str, nvs: int | None = None):
        hw = load_hardware(f"nersc-{system}")
        return dataclasses.replace(hw, nvlink_domain=nvs) if nvs else hw
    return make


@pytest.fixture
def job():
    return load_job

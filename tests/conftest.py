"""Shared fixtures. Integration tests start real DeepSpeed jobs; they write their run
directories under pytest's temporary folder, never into the project's runs/."""

import os

import pytest


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    os.environ["WORKBOOK_RUNS"] = str(path)
    return path

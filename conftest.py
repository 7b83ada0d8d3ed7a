"""Keep every test's runs — notebooks executed by nbval included, whose kernels inherit this
environment — out of the project's own runs/ folder."""

import os
import tempfile


def pytest_configure(config):
    if "WORKBOOK_RUNS" not in os.environ:
        os.environ["WORKBOOK_RUNS"] = tempfile.mkdtemp(prefix="workbook-test-runs-")

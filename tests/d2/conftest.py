"""The end-to-end training tests (tests/d2/test_e2e.py: CPU training, kill/resume, 2-process launch) take about ten
minutes of two CPU cores and are opt-in: set WINPOS_E2E=1 to collect them. The header of every run says so."""
import os

collect_ignore = [] if os.environ.get("WINPOS_E2E") == "1" else ["test_e2e.py"]


def pytest_report_header(config):
    if collect_ignore:
        return "winpos: tests/d2/test_e2e.py NOT collected (opt-in: WINPOS_E2E=1, ~10 min of CPU training)"
    return "winpos: end-to-end training tests collected (WINPOS_E2E=1)"

"""`pytest --portkit-backend NAME`: the conformance cases as pytest items.

The same case objects as `portkit conform` (suite.collect), run by the same runner.Runner, so a
vendor's CI gets pytest's -k, -m, -x, --lf, -n (pytest-xdist) and --junitxml for free. Each
item carries its tier, op and dtype as the marker `portkit(tier=, op=, dtype=)` and the marker
`tierN`. A blocked case is a skip naming the case that blocked it, an unsupported one a skip
with the capability, an xfail-file entry an xfail, a stale entry (xpass) a failure.

A case's prerequisites run first in the same process, unreported, whatever -k, --lf or xdist
leave to it: a worker that gets `kernels/...` but not the `ops/...` it needs still blocks it
when that op is broken. Registered through the `pytest11` entry point `portkit`; it does
nothing without --portkit-backend. With it, the run is a conformance run: test files are not
collected.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from portkit.abi import PortkitError
from portkit.conformance import runner, suite
from portkit.conformance.case import FAILING, Case, Result, Status
from portkit.conformance.target import Target


def pytest_addoption(parser: pytest.Parser) -> None:
    """The --portkit-* options (the `portkit conform` options of the same names)."""
    group = parser.getgroup("portkit", "portkit conformance (see docs/conformance.md)")
    group.addoption("--portkit-backend", metavar="NAME",
                    help="collect the conformance cases of backend NAME instead of test files")
    group.addoption("--portkit-quick", action="store_true",
                    help="the stratified sample of `portkit conform --quick`")
    group.addoption("--portkit-tier", action="append", type=int, choices=sorted(suite.TIERS),
                    help="only this tier (repeatable; default all)")
    group.addoption("--portkit-seed", type=int, default=0, help="random inputs' seed")
    group.addoption("--portkit-xfail", metavar="FILE",
                    help="expected failures: `CASE-PATTERN  reason` per line")
    group.addoption("--portkit-perf-min-ratio", type=float, metavar="R",
                    help="fail a perf case slower than R times the CPU reference")
    group.addoption("--portkit-repro-dir", default="reports/repro", metavar="DIR",
                    help="where failing kernel cases are saved for `portkit replay`")


def pytest_configure(config: pytest.Config) -> None:
    """Registers the markers and, with --portkit-backend, the conformance run."""
    config.addinivalue_line("markers", "portkit(tier, op, dtype): a portkit conformance case")
    for number, module in suite.TIERS.items():
        config.addinivalue_line("markers", f"tier{number}: conformance tier {number} "
                                f"({module.rsplit('_', 1)[-1]})")
    if config.getoption("portkit_backend"):
        config.pluginmanager.register(Conformance(config), "portkit-conformance")


class Conformance:
    """The conformance run of one pytest session: its target, cases and Runner."""

    def __init__(self, config: pytest.Config):
        option = config.getoption
        try:
            self.target = Target.load(option("portkit_backend"))
            xfail_file = option("portkit_xfail")
            xfail = suite.parse_xfail(Path(xfail_file).read_text(), xfail_file) \
                if xfail_file else {}
        except (PortkitError, OSError, ValueError) as error:
            raise pytest.UsageError(f"--portkit-backend {option('portkit_backend')}: "
                                    f"{error}") from None
        self.options = suite.Options(
            tiers=tuple(option("portkit_tier") or sorted(suite.TIERS)),
            quick=option("portkit_quick"), seed=option("portkit_seed"), xfail=xfail,
            xfail_file=xfail_file, perf_min_ratio=option("portkit_perf_min_ratio"),
            repro_dir=option("portkit_repro_dir"))
        self.cases, self.tiers = suite.collect(suite.context(self.target, self.options),
                                               self.options)
        self.runner = runner.Runner(self.target, self.options, self.cases)

    def pytest_report_header(self) -> list[str]:
        """The backend, its device, the number of cases and the tiers that do not run."""
        device = self.target.capabilities.device_name or "-"
        lines = [f"portkit: backend {self.target.name} ({device}), {len(self.cases)} cases"]
        lines += [f"portkit: tier {t['tier']} ({name}) not run: {t['reason']}"
                  for name, t in self.tiers.items() if t["status"] != "run"]
        return lines

    def pytest_ignore_collect(self) -> bool:
        """Test files are not collected: the run is the backend's conformance cases."""
        return True

    @pytest.hookimpl(tryfirst=True)     # before -k, -m and --deselect filter the items
    def pytest_collection_modifyitems(self, session: pytest.Session,
                                      items: list[pytest.Item]) -> None:
        """Adds one item per conformance case, in `portkit conform`'s order."""
        items[:0] = [CaseItem.from_parent(session, name=case.id, case=case, conformance=self,
                                          nodeid=f"portkit/{self.target.name}::{case.id}")
                     for case in self.cases]


class CaseFailure(Exception):
    """A conformance case that failed (or an xfail entry that passed), with its result."""

    def __init__(self, result: Result):
        super().__init__(result.message)
        self.result = result


class CaseItem(pytest.Item):
    """One conformance case as a pytest item."""

    def __init__(self, *, case: Case, conformance: Conformance, **kwargs):
        super().__init__(**kwargs)
        self.case, self.conformance = case, conformance
        self.add_marker(pytest.mark.portkit(tier=case.tier, op=case.op, dtype=case.dtype))
        self.add_marker(f"tier{case.tier}")

    def runtest(self) -> None:
        """Runs the case (after its prerequisites) and maps its status onto pytest's."""
        result = self.conformance.runner.result(self.case)
        self.user_properties.append(("portkit_status", result.status.value))
        if result.status in FAILING:
            raise CaseFailure(result)
        if result.status is Status.XFAIL:
            pytest.xfail(result.message)
        if result.status in (Status.BLOCKED, Status.UNSUPPORTED):
            pytest.skip(f"{result.status.value}: {result.message}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        """The case's message and the command that replays it, not a Python traceback."""
        if isinstance(excinfo.value, CaseFailure):
            result = excinfo.value.result
            return "\n".join(filter(None, [f"{self.case.id}: {result.status.value}",
                                           result.message, result.replay and
                                           f"reproduce: {result.replay}"]))
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the case is reported: its id."""
        return self.path, None, f"{self.conformance.target.name}: {self.case.id}"

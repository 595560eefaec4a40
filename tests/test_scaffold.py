"""`portkit new-backend`: name rules, overwriting, what each starter renders, and end to end:
pip install the generated packages, list them, and run `portkit conform` on them; the llvm
starter's example matrix unit in a matmul."""
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from portkit import backends, scaffold
from portkit.abi import BackendUnavailable, Op, spec
from portkit.abi.dtypes import float32
from portkit.cli import main
from portkit.conformance import runner, suite
from portkit.conformance.case import Status
from portkit.conformance.matrix_cases import KINDS, case_id
from portkit.conformance.target import Target
from portkit.scaffold import ScaffoldError, check_name, generate
from portkit.tensor import Tensor

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("__init__", "device", "capabilities", "renderer", "runtime")


@pytest.fixture(autouse=True)
def only_portkit_backends(fake_backends):
    """portkit's own backends and no others, whatever else is installed here."""
    fake_backends({p.name: p.value for p in backends.entry_points()
                   if p.value.startswith("portkit.")})


@pytest.fixture(autouse=True)
def private_home(monkeypatch, tmp_path_factory):
    """A HOME of its own, so a test sees whether anything was written into it."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize(("name", "says"), [
    ("my-accel", "try 'my_accel'"),
    ("1accel", "starts with a letter"),
    ("MyAccel", "lowercase"),
    ("", "lowercase"),
    ("my accel", "lowercase"),
    ("class", "Python keyword"),
    ("match", "Python keyword"),
    ("cpu", "taken by an existing backend"),
    ("opencl", "taken by an existing backend"),
])
def test_invalid_names_name_the_rule_and_an_example(name, says):
    with pytest.raises(ScaffoldError) as error:
        check_name(name)
    assert says in str(error.value)
    assert "'myaccel'" in str(error.value)


@pytest.mark.parametrize("name", ["myaccel", "my_accel2", "npu"])
def test_valid_names(name):
    check_name(name)


def test_installed_backend_names_are_taken_unless_forced(fake_backends):
    fake_backends({"cpu": "portkit.reference_backends.cpu:backend",
                   "frob": "portkit_frob:backend"})
    with pytest.raises(ScaffoldError, match="'frob' is taken"):
        check_name("frob")
    check_name("frob", force=True)      # regenerating one's own installed backend
    with pytest.raises(ScaffoldError, match="'cpu' is taken"):
        check_name("cpu", force=True)   # portkit's own names never are


@pytest.mark.parametrize("starter", sorted(scaffold.STARTERS))
def test_each_starter_renders_a_complete_package(starter, tmp_path, private_home):
    created = generate("myaccel", tmp_path / "out", starter)
    assert created == tmp_path / "out" / "portkit-myaccel"
    module = created / "portkit_myaccel"
    for part in PARTS:
        source = (module / f"{part}.py").read_text()
        compile(source, f"{part}.py", "exec")
        assert source.startswith('"""'), f"{part}.py must open with what it stands for"
    texts = {path: path.read_text() for path in created.rglob("*") if path.is_file()}
    assert {p.relative_to(created).as_posix() for p in texts} == {
        "README.md", "ci.sh", "pyproject.toml", ".gitignore", "tests/test_conformance.py",
        *(f"portkit_myaccel/{part}.py" for part in PARTS)}
    for path, text in texts.items():
        assert "cookiecutter" not in text, f"{path}: a template variable left unrendered"
    project = texts[created / "pyproject.toml"]
    assert 'name = "portkit-myaccel"' in project
    assert ('[project.entry-points."portkit.backends"]\nmyaccel = "portkit_myaccel:backend"'
            in project)
    assert ('"pyopencl"' in project) == (starter == "opencl")
    assert re.search(r"class MyaccelAllocator\((Host)?Allocator\)", texts[module / "runtime.py"])
    assert os.access(created / "ci.sh", os.X_OK)
    assert subprocess.run(["bash", "-n", str(created / "ci.sh")], check=False).returncode == 0
    assert list(private_home.iterdir()) == [], "cookiecutter wrote into the home folder"


def test_class_names_are_camel_case_from_snake_case_names(tmp_path):
    created = generate("my_npu2", tmp_path, "blank")
    assert "class MyNpu2Renderer(Renderer)" in (created / "portkit_my_npu2" / "renderer.py"
                                               ).read_text()


def test_refuses_to_overwrite_unless_forced(tmp_path):
    created = generate("myaccel", tmp_path)
    renderer = created / "portkit_myaccel" / "renderer.py"
    renderer.write_text("edited")
    (created / "notes.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="already exists; pass --force"):
        generate("myaccel", tmp_path)
    assert renderer.read_text() == "edited"
    generate("myaccel", tmp_path, "blank", force=True)
    assert "NotImplementedError" in renderer.read_text()
    assert (created / "notes.txt").read_text() == "mine"   # files it did not write stay


def test_cli_writes_and_says_what_next(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))   # not a terminal: asks nothing
    assert main(["new-backend", "myaccel"]) == 0
    output = capsys.readouterr().out
    assert "pip install -e ./portkit-myaccel" in output
    assert "portkit conform --backend myaccel" in output
    assert (tmp_path / "portkit-myaccel" / "portkit_myaccel" / "renderer.py").is_file()
    assert main(["new-backend", "myaccel", "--no-input"]) == 2
    assert "--force" in capsys.readouterr().out
    assert main(["new-backend", "myaccel", "--no-input", "--force", "--from", "blank"]) == 0


def test_cli_rejects_a_bad_name_and_writes_nothing(tmp_path, capsys):
    assert main(["new-backend", "my-accel", "--output-dir", str(tmp_path), "--no-input"]) == 2
    assert "invalid backend name 'my-accel'" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_cli_asks_for_what_the_options_do_not_give(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal('opencl\nOur "fast" NPU\nAda\n'))
    assert main(["new-backend", "npu", "--output-dir", str(tmp_path)]) == 0
    project = (tmp_path / "portkit-npu" / "pyproject.toml").read_text()
    assert 'description = "Our \\"fast\\" NPU"' in project      # quotes escaped
    init = tmp_path / "portkit-npu" / "portkit_npu" / "__init__.py"
    compile(init.read_text(), str(init), "exec")
    assert 'authors = [{ name = "Ada" }]' in project
    assert '"pyopencl"' in project


def test_template_ships_in_the_wheel():
    # pyproject maps templates/ into the package; template_dir finds it in either place.
    project = (ROOT / "pyproject.toml").read_text()
    assert '"portkit._templates" = "templates"' in project
    assert '"portkit._templates" = ["**/*", "**/.*"]' in project
    assert scaffold.template_dir() == ROOT / "templates" / "backend"


def _run(site: Path, *command: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python COMMAND` in a fresh process that also sees the packages installed under `site`,
    with a kernel cache of its own (under `site`) shared by every call of one test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(site), os.environ.get("PYTHONPATH")))), "PORTKIT_CACHE": str(site / "cache"),
        "COLUMNS": "200"}
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env,
                          cwd=cwd, check=False)


def _portkit(site: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(site, "-m", "portkit.cli", *args)


def _loads(name: str) -> bool:
    try:
        backends.load(name)
    except BackendUnavailable:
        return False
    return True


@pytest.mark.slow
def test_the_porting_guide_runs_as_written(tmp_path):
    """docs/porting.md's first commands, run as written by bash, the prompts answered with their
    defaults (the C starter). The one change: `.venv` is a fresh virtualenv that sees this
    environment's packages (portkit's command included), so that `pip install -e` changes
    nothing here. About 40 s on 2
    idle cores: pip builds the package (setuptools from PyPI) and the quick run compiles the
    C starter's kernels (the cache starts empty). The package's own tests pass too."""
    block = (ROOT / "docs" / "porting.md").read_text().split("```sh\n", 1)[1].split("```")[0]
    assert block.startswith("source .venv/bin/activate\n"), block
    venv = tmp_path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    [site] = (venv / "lib").glob("python*/site-packages")
    (site / "outer.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    command = venv / "bin" / "portkit"     # what installing portkit there would write
    command.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom portkit.cli import main\n"
                       "if __name__ == '__main__':\n    sys.exit(main())\n")
    command.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
           "PORTKIT_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    ran = subprocess.run(["bash", "-e", "-c", block], input="\n" * 10, cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    assert re.search(r"myaccel.*available", ran.stdout), ran.stdout
    assert "FAILED" not in ran.stdout and "passed" in ran.stdout, ran.stdout[-4000:]
    # ... and the package's own tests, which run the same command (on warm binaries now).
    own = subprocess.run([venv / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests"], cwd=tmp_path / "portkit-myaccel", env=env,
                         capture_output=True, text=True, check=False)
    assert own.returncode == 0 and "2 passed" in own.stdout, own.stdout + own.stderr


@pytest.mark.slow
def test_generated_packages_install_list_and_conform(tmp_path):
    """The blank and OpenCL starters, installed side by side: listed, and conformance says
    what each lacks. About 20 s on 2 idle cores."""
    for name, starter in (("myblank", "blank"), ("mycl", "opencl")):
        generate(name, tmp_path, starter)
    site = tmp_path / "site"
    # --no-index: nothing is downloaded; --no-build-isolation: this environment's setuptools.
    pip = _run(site, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--quiet", "--target", str(site), *(str(p) for p in tmp_path.glob("portkit-*")))
    assert pip.returncode == 0, pip.stdout + pip.stderr

    listed = _portkit(site, "backends")
    assert listed.returncode == 0, listed.stderr
    for name in ("myblank", "mycl"):
        assert name in listed.stdout, listed.stdout
    repro = ("--repro-dir", str(tmp_path / "repro"))

    # The blank starter loads; conformance fails tier 1 with the guide's section and blocks
    # the rest, without a traceback.
    blank = _portkit(site, "conform", "--backend", "myblank", "--quick", *repro)
    assert blank.returncode == 1, blank.stdout + blank.stderr
    assert "Traceback" not in blank.stdout + blank.stderr
    assert "MyblankAllocator.alloc is not written yet" in blank.stdout
    assert "section 'Tier 1: runtime'" in blank.stdout
    assert "blocked" in blank.stdout

    # The OpenCL starter passes the runtime tier and the float32 cases of the next two where
    # an OpenCL driver runs (PoCL here; its builds are slow, hence the sample), and says what
    # is missing where none does.
    opencl = _portkit(site, "conform", "--backend", "mycl", "--quick", "--tier", "1",
                      "--tier", "2", "--tier", "3", "--dtype", "float32", *repro)
    if _loads("opencl"):
        assert opencl.returncode == 0, opencl.stdout + opencl.stderr
        assert "passed" in opencl.stdout
    else:
        assert opencl.returncode == 2 and "cannot load backend 'mycl'" in opencl.stdout


@pytest.mark.slow
def test_llvm_starter_passes_the_full_conformance_run(tmp_path):
    """`portkit new-backend x --from llvm && pip install ./portkit-x && portkit conform
    --backend x`: the whole run, every tier, on the host through llvmlite. About a minute on
    2 idle cores, most of it LLVM compiling kernels (the cache starts empty)."""
    created = generate("myllvm", tmp_path, "llvm")
    renderer = (created / "portkit_myllvm" / "renderer.py").read_text()
    assert "(LLVMRenderer)" in renderer and len(renderer.splitlines()) <= 250
    assert '"llvmlite"' in (created / "pyproject.toml").read_text()
    site = tmp_path / "site"
    pip = _run(site, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--quiet", "--target", str(site), str(created))
    assert pip.returncode == 0, pip.stdout + pip.stderr
    full = _portkit(site, "conform", "--backend", "myllvm", "--json", str(tmp_path / "r.json"),
                    "--repro-dir", str(tmp_path / "repro"))
    assert full.returncode == 0, full.stdout[-6000:] + full.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["cases"]}
    assert {c["tier"] for c in report["cases"] if c["status"] == "passed"} >= {1, 2, 3, 4, 5}
    for case in ("kernels/local/reverse", "kernels/local/tree-sum", "ops/IDIV/int64",
                 "kernels/unfused-multiply-add/float32", "kernels/unfused-multiply-add/float64",
                 "ops/MMA/m1n16k2_float32_float32/precision",
                 "kernels/mma/m1n16k2_float32_float32"):
        assert statuses[case] == "passed", (case, statuses.get(case))
    assert sum(s == "passed" for s in statuses.values()) > 300


@pytest.mark.slow
def test_llvm_starters_matrix_unit_passes_its_cases_and_runs_float32_matmuls(
        tmp_path, monkeypatch, fake_backends):
    """The llvm starter's example unit (renderer.DOT2), in this process: conformance's MMA
    cases pass on it, and a float32 matmul lowered for it is MMA nodes on that unit (packed
    panels, codegen/pack.py), within MMA's bound. About 5 s on 2 idle cores."""
    pytest.importorskip("llvmlite")
    created = generate("myunit", tmp_path, "llvm")
    monkeypatch.syspath_prepend(str(created))
    fake_backends({"myunit": "portkit_myunit:backend"})
    from portkit_myunit.renderer import DOT2
    target = Target.load("myunit")
    assert target.capabilities.matrix_units == (DOT2,)
    options = suite.Options(tiers=(2, 3), pattern="*[Mm][Mm][Aa]*", timeout=120,
                            isolate="none", repro_dir=str(tmp_path / "repro"))
    statuses = {r.case.id: r.status for r in runner.run(target, options).results}
    assert statuses == {**{case_id(DOT2, kind): Status.PASSED for kind in KINDS},
                        f"kernels/mma/{DOT2.name}": Status.PASSED}
    rng = np.random.default_rng(0)
    # edges in m, n and k (an odd K ends part way into a k pair), and a batch
    for a_shape, b_shape in (((37, 45), (45, 29)), ((3, 20, 33), (3, 33, 50))):
        a, b = (rng.standard_normal(s).astype(np.float32) for s in (a_shape, b_shape))
        result = Tensor(a, device="myunit") @ Tensor(b, device="myunit")
        (kernel,) = result.schedule()
        assert any(n.op is Op.MMA and n.arg == DOT2 for n in kernel.nodes), kernel.name
        zeros = np.zeros(result.shape, np.float32)
        exact = spec.mma(a, b, zeros, float32).astype(np.float64)
        bound = spec.mma_bound(a, b, zeros, float32)
        error = np.abs(result.numpy().astype(np.float64) - exact)
        worst = np.unravel_index(np.argmax(error - bound), error.shape)
        assert (error <= bound).all(), (f"{a_shape} @ {b_shape}: worst at {worst}, |error| "
                                        f"{error[worst]:.3g} > bound {bound[worst]:.3g}")


@pytest.mark.slow
def test_vulkan_starter_passes_the_full_conformance_run_on_a_vulkan_driver(tmp_path):
    """`portkit new-backend x --from vulkan && pip install ./portkit-x && portkit conform
    --backend x`: GLSL from the C-style base, SPIR-V by glslangValidator, launched through
    the `vulkan` binding, every tier, on lavapipe here. Without a Vulkan driver, the binding or
    glslangValidator the backend is unavailable and says which fix to apply."""
    created = generate("myvk", tmp_path, "vulkan")
    renderer = (created / "portkit_myvk" / "renderer.py").read_text()
    assert "(CStyleRenderer)" in renderer and len(renderer.splitlines()) <= 120
    assert not re.search(r"def (render|render_body|render_value)\(", renderer)   # no own walk
    assert '"vulkan"' in (created / "pyproject.toml").read_text()
    site = tmp_path / "site"
    pip = _run(site, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--quiet", "--target", str(site), str(created))
    assert pip.returncode == 0, pip.stdout + pip.stderr
    listed = _portkit(site, "backends").stdout
    full = _portkit(site, "conform", "--backend", "myvk", "--json", str(tmp_path / "r.json"),
                    "--repro-dir", str(tmp_path / "repro"))
    if not re.search(r"myvk\s+│\s+available", listed):
        assert full.returncode == 2 and "cannot load backend 'myvk'" in full.stdout, listed
        return
    assert full.returncode == 0, full.stdout[-6000:] + full.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["cases"]}
    # each one a spelling GLSL does not share with C, or a lavapipe float64 fault
    for case in ("ops/CMPLT/bool", "ops/CAST/float16->bool", "ops/TRUNC/float64",
                 "stress/divide-by-zero/float64", "kernels/local/tree-sum"):
        assert statuses.get(case) == "passed", (case, statuses.get(case))
    assert {c["tier"] for c in report["cases"] if c["status"] == "passed"} >= {1, 2, 3, 4, 5, 7}
    assert sum(s == "passed" for s in statuses.values()) > 500


def test_every_guide_section_the_template_names_exists():
    guide = (ROOT / "docs" / "porting.md").read_text()
    headings = {line.lstrip("#")[1:] for line in guide.splitlines()
                if line.startswith(("## ", "### "))}
    named = set()
    for path in (ROOT / "templates").rglob("*"):
        if path.is_file():
            # section 'X', or "X") after a comma or an opening parenthesis that is no call
            for quoted in re.findall(r"""section '([^']+)'|(?:, |(?<![\w.])\()"([A-Z][^"]+)"\)""",
                                     path.read_text()):
                named.add("".join(quoted))
    assert len(named) >= 8, named
    assert named <= headings, f"no such section in docs/porting.md: {named - headings}"


def _normalised(text: str, module: str, prefix: str, name: str) -> list[str]:
    """`text` with a backend's module path, class-name prefix and quoted name made generic."""
    text = text.replace(module, "MODULE.").replace(f'"{name}"', '"NAME"')
    return re.sub(rf"\b{prefix}(?=(Allocator|Compiler|Program|Renderer)\b)", "Prefix",
                  text).splitlines()


@pytest.mark.parametrize(("starter", "reference", "prefix"),
                         [("c", "cpu", "CPU"), ("opencl", "opencl", "OpenCL")])
def test_starters_are_their_reference_backends_line_for_line(starter, reference, prefix,
                                                             tmp_path):
    """A starter cannot drift from the reference backend it starts from: every part it takes
    is that backend's file, line for line once the names are normalised."""
    module = generate("my_npu", tmp_path, starter) / "portkit_my_npu"
    backend = ROOT / "portkit" / "reference_backends" / reference
    assert {p.name for p in module.glob("*.py")} == {p.name for p in backend.glob("*.py")}
    for part in PARTS[1:]:
        ours = _normalised((module / f"{part}.py").read_text(), "portkit_my_npu.", "MyNpu",
                           "my_npu")
        theirs = _normalised((backend / f"{part}.py").read_text(),
                             f"portkit.reference_backends.{reference}.", prefix, reference)
        assert ours == theirs, f"{part}.py differs from reference_backends/{reference}"
    assert not (ROOT / "templates" / "backend" / "templates" / starter).exists(), (
        "a hand-kept copy of the starter; it is written from the reference backend")


@pytest.mark.parametrize(("name", "suggested"), [
    ("My-Accel", "my_accel"), ("my accel!", "my_accel"), ("1npu", "accel_1npu"),
    ("class", "class_accel"), ("cpu", "cpu2"),
])
def test_suggested_names_are_valid_and_free(name, suggested):
    with pytest.raises(ScaffoldError) as error:
        check_name(name)
    assert f"try {suggested!r}" in str(error.value) or f"e.g. {suggested!r}" in str(error.value)
    check_name(suggested)       # the suggestion itself passes


def test_a_taken_names_suggestion_skips_names_also_taken(fake_backends):
    fake_backends({"cpu": "portkit.reference_backends.cpu:backend",
                   "cpu2": "portkit_cpu2:backend", "cpu3": "portkit_cpu3:backend"})
    with pytest.raises(ScaffoldError, match="e.g. 'cpu4'"):
        check_name("cpu")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_end_of_input_at_a_prompt_is_a_clean_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Terminal("opencl\n"))   # then EOF at "description"
    assert main(["new-backend", "npu", "--output-dir", str(tmp_path)]) == 2
    output = capsys.readouterr().out
    assert "no answer (end of input)" in output and "--no-input" in output
    assert "Traceback" not in output and list(tmp_path.iterdir()) == []


def test_ctrl_c_at_a_prompt_cancels_with_130(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sys, "stdin", _Terminal(""))
    monkeypatch.setattr(scaffold.Prompt, "ask", interrupted)
    assert main(["new-backend", "npu", "--output-dir", str(tmp_path)]) == 130
    assert "cancelled; nothing was written" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_missing_cookiecutter_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cookiecutter.main", None)    # import fails as if absent
    monkeypatch.setitem(sys.modules, "cookiecutter", None)
    assert main(["new-backend", "npu", "--output-dir", str(tmp_path), "--no-input"]) == 2
    assert "pip install 'portkit[scaffold]'" in capsys.readouterr().out

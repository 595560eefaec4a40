"""After rendering: the `c` and `opencl` starters' parts are portkit's cpu and opencl reference
backends with their names changed (portkit.scaffold.starter_files), so that a starter cannot
drift from the backend it copies. The `blank` starter's parts are the template's own."""
from pathlib import Path

from portkit.scaffold import starter_files

for part, text in starter_files("{{ cookiecutter.starter }}", "{{ cookiecutter.name }}").items():
    Path("{{ cookiecutter.__module }}", f"{part}.py").write_text(text)

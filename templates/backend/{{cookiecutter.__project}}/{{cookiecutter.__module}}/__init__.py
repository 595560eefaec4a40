"""The {{ cookiecutter.name }} backend: the `Backend` that the entry point in pyproject.toml names.

portkit calls `backend.load()` when someone asks for "{{ cookiecutter.name }}"; device.py finds the
hardware and assembles its parts.
"""
from portkit.abi import Backend
from {{ cookiecutter.__module }}.device import load

# The ABI version this package implements: portkit refuses to load it under another one.
backend = Backend("{{ cookiecutter.name }}", load,
                  {{ cookiecutter.description | tojson }},
                  abi_version="{{ cookiecutter._abi_version }}")

"""The one thing pyproject.toml cannot say: ``examples/`` ships in the wheel as
``introspect/examples`` (package data), so that ``introspect examples DIR`` and every
documented command work from a wheel while the checkout keeps its ``examples/`` folder
where the tests, the notebooks and the CI recipes name it. Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

EXAMPLE_FILES = ["*.py", "*.ipynb", "*/*.py", "*/*.ipynb", "*/*.yml", "*/*.yaml"]

setup(
    packages=[*find_packages(include=["introspect", "introspect.*"]), "introspect.examples"],
    package_dir={"introspect.examples": "examples"},
    package_data={"introspect": ["py.typed"], "introspect.examples": EXAMPLE_FILES},
)

"""The test suite is a package so that its shared helpers import as ``tests.helpers_<area>`` from any folder
(pytest puts the repository root on sys.path: ``pythonpath`` in pyproject.toml)."""

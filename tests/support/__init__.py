"""The suite's helper modules: fakes, rigs and apps the test files import or run.

Each is named in docs/testing.md; none is collected by pytest (no ``test_`` prefix).
"""

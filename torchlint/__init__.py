"""torchlint: find the PyTorch GPU code that is slow or wrong.

Kept import-light: the sanitizer and the flake8 plugin import this package,
and neither should pay for the linter engine unless it is used.
"""

__version__ = "0.1.0"

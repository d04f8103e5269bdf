# fpt's version: the package's, its wheel's (python/_build reads it) and
# bin/fpt's (fpt --version; tests check the two agree).
__version__ = "0.1.0"

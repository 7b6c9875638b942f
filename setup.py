"""The one compiled part: mvc/store/_planes.c (un-grouping byte planes; see that file).

``optional``: where no C compiler is at hand the package installs without it and
reads take the numpy path, which writes the same bytes, more slowly.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("mvc.store._planes", ["mvc/store/_planes.c"], optional=True,
                             extra_compile_args=["-O3"])])

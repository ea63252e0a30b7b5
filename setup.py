"""Build of kmem's one compiled module, ``kmem._core``.

``_core.pyx`` includes the ``_*.pxi`` parts and cimports the types they share from ``_core.pxd``, so
they are listed as dependencies: touching any of them rebuilds the module.
"""
import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

compile_args = [] if os.name == "nt" else ["-O3", "-fno-strict-aliasing"]

core = Extension(
    "kmem._core",
    sources=["kmem/_core.pyx"],
    depends=sorted(glob.glob("kmem/_*.pxi")) + ["kmem/_core.pxd"],
    libraries=[] if os.name == "nt" else ["z"],
    extra_compile_args=compile_args,
)

setup(
    ext_modules=cythonize(
        [core],
        compiler_directives={"language_level": "3", "embedsignature": True},
        annotate=bool(os.environ.get("KMEM_ANNOTATE")),
    ),
)

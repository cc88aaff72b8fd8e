"""Package layout: the folders ``theory/``, ``compressors/`` and ``analysis/`` stay at the top of the source tree (the
design card's layout) and install as ``gradstat.theory``, ``gradstat.compressors`` and ``gradstat.analysis``, so that
nothing generic lands at the top level of site-packages. Everything else is in ``pyproject.toml``.

The C loops (``theory/kernels/_native.c``) are built here, by the package build, as the extension module
``gradstat.theory.kernels._native``: plain C on Python's buffer protocol, independent of the torch version. The
extension is optional: where no C compiler works the build says so and the install goes on without it, and the
package runs its torch and numpy paths instead (``gradstat.theory.kernels.native.absent_reason()`` says why).
An editable install (``pip install -e .``) builds it in place, beside its source."""

import hashlib
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

LAYERS = ("theory", "compressors", "analysis")
NATIVE_SOURCE = "theory/kernels/_native.c"


class BuildNative(build_ext):
    """Compiler flags by compiler family: no contraction of a multiply and an add into one FMA (the C loops must
    round as torch's eager operations do), in C11."""

    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type == "msvc":
            ext.extra_compile_args = ["/O2", "/fp:precise"]
        else:
            ext.extra_compile_args = ["-O2", "-std=gnu11", "-ffp-contract=off"]
        super().build_extension(ext)


def native_extension() -> Extension:
    """The extension, stamped with the SHA-256 of its source: the package refuses a module built from another
    version of the source (a stale in-place build)."""
    digest = hashlib.sha256((Path(__file__).parent / NATIVE_SOURCE).read_bytes()).hexdigest()
    return Extension(
        "gradstat.theory.kernels._native",
        sources=[NATIVE_SOURCE],
        define_macros=[("GS_SOURCE_DIGEST", f'"{digest}"')],
        optional=True,  # no working compiler: a warning, and the package installs without it
    )


setup(
    packages=["gradstat"] + [f"gradstat.{p}" for p in find_packages(include=[f"{layer}*" for layer in LAYERS])],
    package_dir={"gradstat": "gradstat", **{f"gradstat.{layer}": layer for layer in LAYERS}},
    ext_modules=[native_extension()],
    cmdclass={"build_ext": BuildNative},
)

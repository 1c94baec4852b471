"""Build hook of the package (its metadata is pyproject.toml): the wheel ships bpf/, the C data
path edged and edgectl compile at run time, as package data controlplane/bpf/, where
controlplane/bpfsource.py looks first. bpf/ stays at the top of the checkout, where a checkout
(and an editable install) finds it. MANIFEST.in puts bpf/ into the sdist."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TOP = Path(__file__).resolve().parent
SHIPPED = ("*.c", "include/*.h")  # bpf/'s programs and headers; nothing else is compiled


class BuildPy(build_py):
    """build_py, plus bpf/'s sources copied to controlplane/bpf/ in the build tree."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, bpf/ and all
        for pattern in SHIPPED:
            for src in sorted((TOP / "bpf").glob(pattern)):
                dst = Path(self.build_lib) / "controlplane" / "bpf" / src.relative_to(TOP / "bpf")
                self.mkpath(str(dst.parent))
                self.copy_file(str(src), str(dst))


setup(cmdclass={"build_py": BuildPy})

"""Bundles the C library into the package when one is built: ATTN_LIBRARY, or
libattncomm.so in a build directory of this checkout (../build, ../build-*).
pip builds in place (pip >= 21.3), so the checkout is reachable from here.
Without one the package finds the library at import (attncomm/__init__.py)."""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    env = os.environ.get("ATTN_LIBRARY")
    if env and os.path.exists(env):
        return env
    root = os.path.dirname(HERE)
    for d in ["build"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "build-*"))):
        path = os.path.join(root, d, "libattncomm.so")
        if os.path.exists(path):
            return path
    return None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib:
            dest = os.path.join(self.build_lib, "attncomm", "libattncomm.so")
            shutil.copy2(os.path.realpath(lib), dest)
            print(f"attncomm: bundled {lib}")
        else:
            print("attncomm: no built libattncomm.so found; the package will look for one at import")


setup(cmdclass={"build_py": BuildWithLibrary})

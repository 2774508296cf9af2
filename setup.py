"""Builds the optional compiled append path (``broker_sim.store._codec``, see broker_sim/store/codec.py).

Everything else about the package lives in pyproject.toml. ``optional=True``: when no C compiler or Python
headers are available the install still succeeds and broker_sim uses the pure-Python fallback."""

from setuptools import Extension, setup

HEADERS = ("support", "append", "dispatch", "put", "gate", "lock")  # included by _codec.c

setup(
    ext_modules=[
        Extension(
            "broker_sim.store._codec",
            ["broker_sim/store/_codec.c"],
            depends=[f"broker_sim/store/_codec_{part}.h" for part in HEADERS],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-declaration-after-statement"],
        )
    ]
)

"""Build step for psflow's optional C kernels (everything else is in pyproject.toml).

``psflow.ps._kernels`` holds the ps tasks' fused Adagrad and FTRL updates (numpy twins in
``psflow/ps/optimizers.py``) and the dynamic tables' id index and small-batch unique (numpy twins in
``psflow/ps/dynamic/id_index.py`` and ``rows.py``).  ``psflow.data._native`` holds the input pipeline's per-byte loops (TFRecord framing, CRC32C,
walking Examples, matching their keys, packed varints and floats, string lists).  ``psflow.native._ids`` holds
the id loops both sides use (a batch's distinct ids, a request's range and order check; numpy twins in
``psflow/native/ids.py``).  ``psflow.torch._lookup`` holds a worker's embedding gathers and their gradients'
scatter-adds (torch twins in ``psflow/torch/lookup_rows.py``).  ``psflow.models._logistic`` holds the logistic
model's per-entry forward products and gradient sums (numpy twins in ``psflow/models/logistic.py``).
``psflow/native/buffers.h`` holds the buffer helpers the last three share.
All are optional: when no C compiler is
available the install goes on and psflow uses the numpy (or torch) versions of the same loops (see
``psflow/native/loader.py``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "psflow.data._native",
            ["psflow/data/_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "psflow.native._ids",
            ["psflow/native/_ids.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "psflow.torch._lookup",
            ["psflow/torch/_lookup.c"],
            depends=["psflow/native/buffers.h"],
            # No fused multiply-adds: the lookups' sums must round as PyTorch's mul and index_add_ (the twins) do.
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "psflow.models._logistic",
            ["psflow/models/_logistic.c"],
            depends=["psflow/native/buffers.h"],
            # No fused multiply-adds: the products must round as numpy's twins' do.
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "psflow.ps._kernels",
            ["psflow/ps/_kernels.c"],
            depends=["psflow/native/buffers.h"],
            # No fused multiply-adds (the updates must round exactly as numpy's twins do); sqrt without errno, so
            # the loops vectorize (IEEE sqrt and division are exact in vector registers too).
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
